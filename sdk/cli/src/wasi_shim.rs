//! A WASI preview1 shim for Go NFs, used instead of the standard
//! preview1 adapter.
//!
//! Go's wasip1 runtime grows linear memory with `memory.grow` and assumes
//! nobody else does; the standard adapter allocates its own state the same
//! way (or through the module's `cabi_realloc`, which Go cannot serve
//! before its runtime is up), and the two overlap. An NF needs none of
//! what the adapter offers (no files, sockets, environment or clocks), so
//! this shim answers Go's preview1 imports itself, statelessly: stdout and
//! stderr go to the host log (`sluice:nf/host-log`), clocks read a frozen
//! instant (as the host's own clocks do), random bytes come from a fixed
//! generator (hash seeds, deterministic like everything else an NF sees),
//! `poll_oneoff` reports every subscription ready, other descriptor
//! functions answer EBADF and everything else ENOSYS.

use std::fmt::Write;
use wasmparser::{Parser, Payload, TypeRef, ValType};

const ENOSYS: i32 = 52;
const EBADF: i32 = 8;

/// The shim for the preview1 functions `core` imports, as a core module
/// carrying its component type (it imports `host-log`).
pub fn build(core: &[u8], wit_dir: &std::path::Path) -> Result<Vec<u8>, String> {
    let imports = preview1_imports(core)?;
    let v = crate::sdk::contract_version(crate::Lang::Go);
    let mut wat = format!(
        "(module\n  (import \"env\" \"memory\" (memory 0))\n  (import \"sluice:nf/host-log@{v}\" \"log\" (func $log (param i32 i32 i32)))\n  (global $seed (mut i64) (i64.const 0x2545f4914f6cdd1d))\n",
    );
    for (name, params, results) in &imports {
        let sig: String = params.iter().map(|t| format!(" {}", wat_type(*t))).collect();
        let res: String = results.iter().map(|t| format!(" {}", wat_type(*t))).collect();
        let body = body(name, results.len());
        let _ = writeln!(
            wat,
            "  (func (export \"{name}\") (param{sig}){} {body})",
            if res.is_empty() { String::new() } else { format!(" (result{res})") }
        );
    }
    wat.push_str(")\n");
    let mut shim = wat::parse_str(&wat).map_err(|e| format!("assembling the WASI shim: {e}"))?;
    let mut resolve = wit_parser::Resolve::default();
    resolve.push_dir(wit_dir).map_err(|e| format!("reading the contract {}: {e:#}", wit_dir.display()))?;
    let pkg = resolve
        .push_str(
            "wasi-shim.wit",
            &format!("package sluice:wasi-shim;\nworld shim {{ import sluice:nf/host-log@{v}; }}\n"),
        )
        .map_err(|e| format!("{e:#}"))?;
    let world = resolve.select_world(&[pkg], Some("shim")).map_err(|e| format!("{e:#}"))?;
    wit_component::embed_component_metadata(&mut shim, &resolve, world, wit_component::StringEncoding::UTF8)
        .map_err(|e| format!("{e:#}"))?;
    Ok(shim)
}

fn wat_type(t: ValType) -> &'static str {
    match t {
        ValType::I64 => "i64",
        ValType::F32 => "f32",
        ValType::F64 => "f64",
        _ => "i32",
    }
}

/// The body of one preview1 function (parameters are locals 0..n).
fn body(name: &str, results: usize) -> String {
    match name {
        // fd_write(fd, iovs, iovs_len, nwritten): every iovec to the host
        // log at level warn (Go writes only panics and prints there).
        "fd_write" => "(local $i i32) (local $total i32) (local $len i32)
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get 2)))
      (local.set $len (i32.load offset=4 (i32.add (local.get 1) (i32.shl (local.get $i) (i32.const 3)))))
      (if (i32.gt_u (local.get $len) (i32.const 0))
        (then (call $log (i32.const 2) (i32.load (i32.add (local.get 1) (i32.shl (local.get $i) (i32.const 3)))) (local.get $len))))
      (local.set $total (i32.add (local.get $total) (local.get $len)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (i32.store (local.get 3) (local.get $total))
    (i32.const 0)"
            .to_string(),
        // clock_time_get(id, precision, out): one frozen second.
        "clock_time_get" => "(i64.store (local.get 2) (i64.const 1000000000)) (i32.const 0)".to_string(),
        "clock_res_get" => "(i64.store (local.get 1) (i64.const 1000000000)) (i32.const 0)".to_string(),
        // random_get(buf, len): xorshift64* from a fixed seed.
        "random_get" => "(local $i i32)
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get 1)))
      (global.set $seed (i64.xor (global.get $seed) (i64.shr_u (global.get $seed) (i64.const 12))))
      (global.set $seed (i64.xor (global.get $seed) (i64.shl (global.get $seed) (i64.const 25))))
      (global.set $seed (i64.xor (global.get $seed) (i64.shr_u (global.get $seed) (i64.const 27))))
      (i32.store8 (i32.add (local.get 0) (local.get $i))
        (i32.wrap_i64 (i64.shr_u (i64.mul (global.get $seed) (i64.const 0x2545f4914f6cdd1d)) (i64.const 56))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (i32.const 0)"
            .to_string(),
        // No arguments, no environment.
        "args_sizes_get" | "environ_sizes_get" => {
            "(i32.store (local.get 0) (i32.const 0)) (i32.store (local.get 1) (i32.const 0)) (i32.const 0)".to_string()
        }
        "args_get" | "environ_get" | "sched_yield" => "(i32.const 0)".to_string(),
        // poll_oneoff(in, out, n, nevents): every subscription is ready
        // (there is no time to wait for).
        "poll_oneoff" => "(local $i i32) (local $ev i32) (local $sub i32)
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get 2)))
      (local.set $sub (i32.add (local.get 0) (i32.mul (local.get $i) (i32.const 48))))
      (local.set $ev (i32.add (local.get 1) (i32.shl (local.get $i) (i32.const 5))))
      (i64.store (local.get $ev) (i64.load (local.get $sub)))
      (i32.store16 offset=8 (local.get $ev) (i32.const 0))
      (i32.store8 offset=10 (local.get $ev) (i32.load8_u offset=8 (local.get $sub)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (i32.store (local.get 3) (local.get 2))
    (i32.const 0)"
            .to_string(),
        "proc_exit" | "proc_raise" => "(unreachable)".to_string(),
        _ if results == 0 => String::new(),
        // There are no descriptors besides stdout and stderr: EBADF also
        // ends Go's scan of preopened directories at start-up.
        _ if name.starts_with("fd_") || name.starts_with("path_") => format!("(i32.const {EBADF})"),
        _ => format!("(i32.const {ENOSYS})"),
    }
}

/// A preview1 function the module imports: name, parameters, results.
type Preview1Import = (String, Vec<ValType>, Vec<ValType>);

/// The functions `core` imports from `wasi_snapshot_preview1`, with their
/// parameter and result types.
fn preview1_imports(core: &[u8]) -> Result<Vec<Preview1Import>, String> {
    let mut types = Vec::new();
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(core) {
        match payload.map_err(|e| format!("reading the Go module: {e}"))? {
            Payload::TypeSection(reader) => {
                for group in reader {
                    let group = group.map_err(|e| e.to_string())?;
                    for ty in group.into_types() {
                        types.push(ty.unwrap_func().clone());
                    }
                }
            }
            Payload::ImportSection(reader) => {
                for imports in reader {
                    for import in imports.map_err(|e| e.to_string())? {
                        let (_, import) = import.map_err(|e| e.to_string())?;
                        if import.module != "wasi_snapshot_preview1" {
                            continue;
                        }
                        let TypeRef::Func(idx) = import.ty else { continue };
                        let ty = types.get(idx as usize).ok_or("import of an undefined type")?;
                        // Go's runtime and syscall packages import some
                        // functions twice; the shim exports each once.
                        if out.iter().any(|(n, _, _)| n == import.name) {
                            continue;
                        }
                        out.push((import.name.to_string(), ty.params().to_vec(), ty.results().to_vec()));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}
