//! Pool of OpenAI-compatible model servers (placeholder).
