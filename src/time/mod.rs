//! Time: the boot clock every lease deadline is measured on, the deadline
//! rule both guardians share, and the strict `DUR` grammar of the command
//! line.

pub mod clock;
pub mod deadline;
pub mod duration;
