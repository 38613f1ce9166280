//! The OCI images (`make images`, deploy/images/build.sh): built here from
//! the binaries under test, unpacked with umoci, their configuration read
//! (entrypoint, user, environment) and their root filesystems run as a
//! container would run them: as the image's user, with /proc, /sys and
//! /dev mounted, nothing from the build machine. The host image forwards a
//! capture through an NF over DPDK with the drivers it carries.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// Unpacks image `name` into `dir/<name>` and returns its runtime config.
fn unpack(images: &Path, dir: &Path, name: &str) -> Value {
    let bundle = dir.join(name);
    let st = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{}", images.join(name).display(), version()))
        .arg(&bundle)
        .status()
        .unwrap();
    assert!(st.success(), "umoci unpack {name}");
    serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap()
}

/// Runs `args` in the root filesystem of `bundle` as the image's user,
/// with /proc, /sys and /dev mounted (in a mount namespace of its own).
fn run_in(bundle: &Path, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let root = bundle.join("rootfs");
    let r = root.display();
    let script = format!(
        "mount --rbind /sys {r}/sys && mount -t proc proc {r}/proc && mount --rbind /dev {r}/dev && \
         exec chroot --userspec=65532:65532 {r} \"$@\""
    );
    Command::new("unshare")
        .args(["-m", "sh", "-c", &script, "sh"])
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn images_hold_what_their_binaries_need_and_run_unprivileged() {
    let _turn = beside_others();
    let dir = test_dir();
    let images = dir.path().join("images");
    let out = Command::new("bash")
        .arg(workspace().join("deploy/images/build.sh"))
        .arg(&images)
        .current_dir(workspace())
        .env("SLUICE_BIN", bin_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    for (name, bin, cmd) in [("sluice-gateway", "sluice-gateway", None), ("sluice-host", "sluice-host", Some("serve"))]
    {
        // Small: the binary, its libraries (and the host's DPDK drivers).
        let size: u64 = walk(&images.join(name));
        assert!(size < 48 << 20, "{name} is {} MiB", size >> 20);
        let config = unpack(&images, dir.path(), name);
        let process = &config["process"];
        let args: Vec<&str> = process["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        let mut want = vec![format!("/usr/local/bin/{bin}")];
        want.extend(cmd.map(String::from));
        assert_eq!(args, want, "{name}'s entrypoint");
        assert_eq!((process["user"]["uid"].as_u64(), process["user"]["gid"].as_u64()), (Some(65532), Some(65532)));
        assert_eq!(process["cwd"], "/var/lib/sluice");
        let env: Vec<&str> = process["env"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
        assert!(env.contains(&"HOME=/var/lib/sluice"), "{env:?}");
        // Its binary runs from the image alone.
        let v = run_in(
            &dir.path().join(name),
            &[("HOME", "/var/lib/sluice")],
            &[&format!("/usr/local/bin/{bin}"), "--version"],
        );
        assert!(v.status.success(), "{name}: {}", String::from_utf8_lossy(&v.stderr));
        assert_eq!(String::from_utf8_lossy(&v.stdout).trim(), format!("{bin} {}", version()));
    }

    // The host forwards a capture through an NF on DPDK (net_pcap), as its
    // unprivileged user, with the drivers in the image.
    let host = dir.path().join("sluice-host");
    let tmp = host.join("rootfs/tmp");
    std::fs::copy(trace(dir.path(), 100), tmp.join("in.pcap")).unwrap();
    std::fs::copy(nf("counter"), tmp.join("counter.wasm")).unwrap();
    let out = run_in(
        &host,
        &[("HOME", "/var/lib/sluice")],
        &[
            "/usr/local/bin/sluice-host",
            "dpdk",
            "--nf",
            "/tmp/counter.wasm",
            "--idle-exit-ms",
            "500",
            "--",
            "--no-huge",
            "--no-pci",
            "-m",
            "256",
            "--log-level=lib.eal:error",
            "--vdev=net_pcap0,rx_pcap=/tmp/in.pcap,tx_pcap=/tmp/out.pcap",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let n = read_count(&tmp.join("in.pcap"));
    assert!(text.contains(&format!("packets: {n} rx, {n} tx")), "{text}");
    assert_eq!(read_count(&tmp.join("out.pcap")), n);
}

fn walk(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .unwrap()
        .flatten()
        .map(|e| if e.file_type().unwrap().is_dir() { walk(&e.path()) } else { e.metadata().unwrap().len() })
        .sum()
}
