//! Loading modules: every kind of wrong file gets its own clear error; the
//! code cache is reused.

use sluice_runtime::{Runtime, RuntimeConfig, RuntimeError};
use sluice_tests::{nf, test_nf};

fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig::default()).unwrap()
}

#[test]
fn random_bytes_are_not_wasm() {
    let e = runtime().load("junk", b"this is not a module at all").unwrap_err();
    assert!(matches!(e, RuntimeError::NotWasm { .. }), "{e}");
    assert!(e.to_string().contains("not a WebAssembly binary"));
    assert!(matches!(runtime().load("empty", b"").unwrap_err(), RuntimeError::NotWasm { .. }));
}

#[test]
fn a_core_module_is_not_a_component() {
    // The smallest valid core module: magic and version 1.
    let e = runtime().load("core", b"\0asm\x01\0\0\0").unwrap_err();
    assert!(matches!(e, RuntimeError::CoreModule { .. }), "{e}");
    assert!(e.to_string().contains("not a component"), "{e}");
}

#[test]
fn a_component_of_another_world_is_refused() {
    let e = runtime().load_file(&test_nf("wrong-world")).unwrap_err();
    assert!(matches!(e, RuntimeError::WrongWorld { .. }), "{e}");
    assert!(e.to_string().contains("sluice:nf"), "{e}");
}

#[test]
fn a_truncated_component_is_invalid() {
    let bytes = std::fs::read(nf("firewall")).unwrap();
    let e = runtime().load("cut", &bytes[..bytes.len() / 2]).unwrap_err();
    assert!(matches!(e, RuntimeError::Invalid { .. }), "{e}");
}

#[test]
fn compiled_code_is_cached_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = RuntimeConfig { cache_dir: Some(dir.path().to_path_buf()), ..RuntimeConfig::default() };
    let first = Runtime::new(cfg.clone()).unwrap();
    let a = first.load_file(&nf("noop")).unwrap();
    assert_eq!(first.cache_stats().unwrap().0, 0);
    drop(first);
    let second = Runtime::new(cfg).unwrap();
    let b = second.load_file(&nf("noop")).unwrap();
    let (hits, _) = second.cache_stats().unwrap();
    assert!(hits >= 1, "second load should hit the cache");
    assert_eq!(a.digest(), b.digest());
    assert_eq!(a.digest().len(), 64);
}

#[test]
fn the_same_bytes_loaded_twice_share_their_code_while_either_lives() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = RuntimeConfig { cache_dir: Some(dir.path().to_path_buf()), ..RuntimeConfig::default() };
    let rt = Runtime::new(cfg).unwrap();
    let bytes = std::fs::read(nf("noop")).unwrap();
    let a = rt.load("tenant-a", &bytes).unwrap();
    let b = rt.load("tenant-b", &bytes).unwrap();
    // One copy of the machine code for both tenants, each under its name.
    assert!(a.shares_code_with(&b));
    assert_eq!((a.name(), b.name()), ("tenant-a", "tenant-b"));
    let other = rt.load_file(&nf("firewall")).unwrap();
    assert!(!a.shares_code_with(&other));
    let (hits, misses) = rt.cache_stats().unwrap();
    // Gone with its last module: the next load comes from the code cache.
    drop((a, b));
    let c = rt.load("tenant-c", &bytes).unwrap();
    assert_eq!(rt.cache_stats().unwrap(), (hits + 1, misses));
    assert_eq!(c.name(), "tenant-c");
}
