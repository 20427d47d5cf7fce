//! The coordinator's closure queue (being written).
