//! Compiles the C shim against the system's DPDK (found with pkg-config)
//! and links DPDK. Fails with a clear message when DPDK is missing.

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    // First only the include paths (to compile the shim), then the link
    // flags: the static shim must come before the DPDK libraries it uses.
    let lib = match pkg_config::Config::new().atleast_version("22.11").cargo_metadata(false).probe("libdpdk") {
        Ok(lib) => lib,
        Err(e) => {
            println!(
                "cargo:warning=DPDK (libdpdk >= 22.11) not found by pkg-config: {e}. Install it with `apt-get install libdpdk-dev` (or `make setup`), or build without the `dpdk` feature."
            );
            std::process::exit(1);
        }
    };
    let mut build = cc::Build::new();
    build.file("csrc/shim.c").opt_level(3).warnings(true);
    for p in &lib.include_paths {
        build.include(p);
    }
    // DPDK's headers need its config header and a CPU baseline; take the
    // flags pkg-config gives besides include paths.
    if let Ok(out) = std::process::Command::new("pkg-config").args(["--cflags", "libdpdk"]).output() {
        let flags = String::from_utf8_lossy(&out.stdout).to_string();
        let mut it = flags.split_whitespace();
        while let Some(f) = it.next() {
            if f == "-include" {
                if let Some(h) = it.next() {
                    build.flag("-include").flag(h);
                }
            } else if f.starts_with("-m") {
                build.flag(f);
            }
        }
    }
    build.compile("sluice_dpdk_shim");
    if let Err(e) = pkg_config::Config::new().atleast_version("22.11").probe("libdpdk") {
        println!("cargo:warning=linking DPDK failed: {e}");
        std::process::exit(1);
    }
}
