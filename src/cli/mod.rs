//! The longer commands of the `tiergate` binary (not part of the library).

pub mod agreement;
pub mod audit;
pub mod calibrate;
pub mod drift;
pub mod features;
pub mod feedback;
pub mod model;
pub mod report;
pub mod time;
pub mod tune;
