//! Time: the boot clock every lease deadline is measured on, and the strict
//! `DUR` grammar of the command line.

pub mod clock;
pub mod duration;
