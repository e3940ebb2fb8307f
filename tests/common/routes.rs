//! `[[routes]]` tables (TOML) for [`super::config_with_routes`] and `tiergate serve` configs.

/// A `[[routes]]` table named `name` that forwards every request to `upstream`.
pub fn route_all(name: &str, upstream: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\nupstream = [\"{upstream}\"]\n")
}

/// A `[[routes]]` table named `name` that forwards the requests under `path_prefix` to
/// `upstream`, unscreened.
pub fn route(name: &str, path_prefix: &str, upstream: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\npath_prefix = \"{path_prefix}\"\nupstream = [\"{upstream}\"]\n")
}

/// [`route`] screening the text at `/text` of its JSON bodies, with the further
/// `[routes.screen]` lines `screen` (`key = value` each).
pub fn screened_route(name: &str, path_prefix: &str, upstream: &str, screen: &[&str]) -> String {
    let mut table = route(name, path_prefix, upstream);
    table.push_str("[routes.screen]\ntext = [\"/text\"]\n");
    for line in screen {
        table.push_str(line);
        table.push('\n');
    }
    table
}
