//! Worker/PS failure classification (being written).
