//! Time: the boot clock every lease deadline is measured on, the deadline
//! rule both guardians share, milliseconds and "now" on each clock, and the
//! strict `DUR` grammar of the command
//! line.

pub mod clock;
pub mod deadline;
pub mod duration;
pub mod millis;

pub use millis::{boot_ms, ms, wall_ms};
