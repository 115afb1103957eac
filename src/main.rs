//! `leaseagent`: the program lives in the library (`leaseagent::main`), so
//! that every module but the public `fence` API stays private to the crate.

fn main() -> std::process::ExitCode {
    leaseagent::main()
}
