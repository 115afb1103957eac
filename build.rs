//! Links the binaries with `link/code-groups.ld`, which groups their code
//! by the part that uses it so that an agent run keeps fewer pages of the
//! program resident (the script's comment says why). Linux/glibc only: the
//! script is for GNU ld and lld, and the target the binaries are measured
//! and shipped on.

fn main() {
    println!("cargo:rerun-if-changed=link/code-groups.ld");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/link/code-groups.ld");
    }
}
