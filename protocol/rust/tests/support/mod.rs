//! Shared by the integration tests and the vector generator.
pub mod gen;
