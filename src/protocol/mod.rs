//! Wire formats shared by a client and a server in this crate.

pub mod v1;
