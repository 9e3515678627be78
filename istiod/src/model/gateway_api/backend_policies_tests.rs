//! Unit tests of [`super`]: what the goldens do not pin down.
