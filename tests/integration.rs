//! Integration tests (placeholder while the harness is written).
