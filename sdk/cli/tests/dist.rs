//! The release tarball (`make dist`, deploy/dist/build.sh) as a new user
//! meets it: unpacked into an empty directory, `HOME` a fresh folder, no
//! checkout on `PATH` or in any setting; `sluice nf new`, `nf build` and `nf test` in
//! all five languages from the SDK it carries (installed under the user's
//! data directory, which the projects reference), and every component
//! uploaded to a `sluice dev` started from the tarball, one of them
//! deployed and running; unchanged Python and JavaScript projects deploy
//! again without a version bump; a project copied elsewhere builds; every
//! path the documentation and `--help` name is in the tarball. The wheel
//! installs with pip and the npm package is a package.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).canonicalize().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}", text(&o));
    text(&o)
}

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// The directories of a program on the test's PATH.
fn dir_of(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).find(|d| d.join(program).is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_tarball_builds_and_uploads_nfs_in_every_language_without_a_checkout() {
    let ws = workspace();
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().canonicalize().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_sluice")).parent().unwrap().to_path_buf();

    // make dist, into the test's directory.
    let dist = tmp_path.join("dist");
    let o = Command::new("bash")
        .arg(ws.join("deploy/dist/build.sh"))
        .arg(&dist)
        .env("SLUICE_BIN", &bin_dir)
        .current_dir(&ws)
        .output()
        .unwrap();
    ok(o, "deploy/dist/build.sh");
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("sluice-{version}-x86_64-linux");
    let tarball = dist.join(format!("{name}.tar.gz"));
    assert!(tarball.is_file());

    // Unpacked into an empty directory.
    let opt = tmp_path.join("opt");
    std::fs::create_dir_all(&opt).unwrap();
    ok(Command::new("tar").arg("-C").arg(&opt).arg("-xzf").arg(&tarball).output().unwrap(), "tar");
    let prefix = opt.join(&name);
    for f in [
        "bin/sluice",
        "bin/sluice-host",
        "bin/sluice-gateway",
        "share/sluice/wit/v0.4.0/nf.wit",
        "share/sluice/wit/v0.5.0/nf.wit",
        "share/sluice/wit/v0.6.0/nf.wit",
        "share/sluice/wit/v0.7.0/nf.wit",
        "share/sluice/sdk/rust/Cargo.toml",
        "share/sluice/sdk/c/include/sluice_nf.h",
        "share/sluice/sdk/python/pyproject.toml",
        "share/sluice/sdk/js/package.json",
        "share/sluice/sdk/go/go.mod",
        &format!("share/sluice/js/sluice-nf-{version}.tgz"),
        &format!("share/sluice/python/sluice_nf-{version}-py3-none-any.whl"),
    ] {
        assert!(prefix.join(f).exists(), "the tarball has no {f}");
    }
    let rust_sdk = std::fs::read_to_string(prefix.join("share/sluice/sdk/rust/Cargo.toml")).unwrap();
    assert!(!rust_sdk.contains("workspace = true") && !rust_sdk.contains("../"), "{rust_sdk}");

    // A fresh user: HOME empty, the tarball's bin/ first on PATH, the
    // toolchains where they are (their homes named, since HOME moved).
    let home = tmp_path.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let real_home = var("HOME");
    let mut path: Vec<PathBuf> = vec![prefix.join("bin")];
    for tool in ["cargo", "clang", "go", "node", "npm", "componentize-py", "python3", "tar"] {
        if let Some(d) = dir_of(tool)
            && !d.starts_with(&ws)
            && !path.contains(&d)
        {
            path.push(d);
        }
    }
    path.extend(["/usr/local/bin", "/usr/bin", "/bin"].map(PathBuf::from));
    let path = std::env::join_paths(&path).unwrap();
    let user = |program: &Path, dir: &Path| {
        let mut c = Command::new(program);
        c.current_dir(dir)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", &path)
            .env("RUSTUP_HOME", std::env::var("RUSTUP_HOME").unwrap_or(format!("{real_home}/.rustup")))
            .env("CARGO_HOME", std::env::var("CARGO_HOME").unwrap_or(format!("{real_home}/.cargo")))
            .env("PYENV_ROOT", std::env::var("PYENV_ROOT").unwrap_or(format!("{real_home}/.pyenv")))
            // Caches of downloads and compiles, not sources: builds here
            // take what earlier runs fetched.
            .env("npm_config_cache", format!("{real_home}/.npm"))
            .env("GOCACHE", format!("{real_home}/.cache/go-build"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local");
        c
    };
    let sluice = prefix.join("bin/sluice");
    let projects = tmp_path.join("projects");
    std::fs::create_dir_all(&projects).unwrap();
    let sdk_copies = home.join(".local/share/sluice/sdk");
    let cargo_target = ws.join("target/dist-rust");

    let mut built = Vec::new();
    for lang in ["rust", "c", "python", "js", "go"] {
        let nf = format!("fw-{lang}");
        ok(
            user(&sluice, &projects)
                .args(["nf", "new", &nf, "--lang", lang, "--template", "firewall"])
                .output()
                .unwrap(),
            &format!("nf new ({lang})"),
        );
        let project = projects.join(&nf);
        // The project names the SDK through its own link, never by an
        // absolute path; the link leads to the installed copy, never to a
        // checkout or the unpacked tarball.
        for f in ["Cargo.toml", "go.mod", "jsconfig.json", "README.md"] {
            if let Ok(t) = std::fs::read_to_string(project.join(f)) {
                assert!(!t.contains(tmp_path.to_str().unwrap()), "{lang} {f} holds an absolute path: {t}");
                assert!(!t.contains(ws.to_str().unwrap()), "{lang} {f} names the checkout: {t}");
                if f != "README.md" {
                    assert!(t.contains(".sluice/sdk/sdk/"), "{lang} {f} does not name the SDK link: {t}");
                }
            }
        }
        let linked = std::fs::read_link(project.join(".sluice/sdk")).unwrap();
        assert!(linked.starts_with(&sdk_copies), "{lang}: .sluice/sdk -> {}", linked.display());
        let ignored = std::fs::read_to_string(project.join(".gitignore")).unwrap();
        assert!(ignored.lines().any(|l| l == "/.sluice") && ignored.lines().any(|l| l == "/build"), "{ignored}");
        if lang == "python" {
            assert!(ignored.lines().any(|l| l == "__pycache__/"), "{ignored}");
        }
        let o = user(&sluice, &project)
            .args(["nf", "build", "--cargo-target-dir", cargo_target.to_str().unwrap()])
            .output()
            .unwrap();
        let out = ok(o, &format!("nf build ({lang})"));
        let contract = if matches!(lang, "python" | "js") { "sluice:nf@0.7.0" } else { "sluice:nf@0.6.0" };
        assert!(out.contains(contract), "{out}");
        let o = user(&sluice, &project)
            .args(["nf", "test", "--cargo-target-dir", cargo_target.to_str().unwrap()])
            .output()
            .unwrap();
        let out = ok(o, &format!("nf test ({lang})"));
        assert!(out.contains("1 passed, 0 failed"), "{out}");
        built.push((nf.clone(), project.join("build").join(format!("{nf}.wasm"))));
    }
    // One copy, named by version and content digest.
    let copies: Vec<PathBuf> = std::fs::read_dir(&sdk_copies).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let copy = &copies[0];
    assert!(copy.file_name().unwrap().to_str().unwrap().starts_with(&format!("{version}-")), "{copies:?}");
    assert!(copy.join("sdk/rust/vendor/sluice-wire/Cargo.toml").is_file());

    // A project is portable: copied elsewhere (its link left behind, as
    // git would), it builds.
    let moved = tmp_path.join("elsewhere/fw-go");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    ok(Command::new("cp").arg("-r").arg(projects.join("fw-go")).arg(&moved).output().unwrap(), "cp");
    std::fs::remove_dir_all(moved.join(".sluice")).unwrap();
    std::fs::remove_dir_all(moved.join("build")).unwrap();
    ok(user(&sluice, &moved).args(["nf", "build"]).output().unwrap(), "nf build (a copied Go project)");

    // Every path the documentation and --help name is in the tarball.
    check_named_paths(&prefix, &sluice, &user);

    // The Python SDK installs from its wheel; the npm package holds the SDK.
    let site = tmp_path.join("site");
    let wheel = prefix.join(format!("share/sluice/python/sluice_nf-{version}-py3-none-any.whl"));
    ok(
        user(Path::new("python3"), &tmp_path)
            .args(["-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target"])
            .arg(&site)
            .arg(&wheel)
            .output()
            .unwrap(),
        "pip install the wheel",
    );
    assert!(site.join("sluice_nf/__init__.py").is_file());
    let listing = ok(
        Command::new("tar")
            .arg("-tzf")
            .arg(prefix.join(format!("share/sluice/js/sluice-nf-{version}.tgz")))
            .output()
            .unwrap(),
        "tar -t the npm package",
    );
    for f in ["package/package.json", "package/src/index.js", "package/src/index.d.ts"] {
        assert!(listing.contains(f), "{listing}");
    }

    // sluice dev from the tarball; every component uploaded, one deployed.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let dev_data = tmp_path.join("dev");
    let log = std::fs::File::create(tmp_path.join("dev.log")).unwrap();
    let mut dev = user(&sluice, &tmp_path)
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--data"])
        .arg(&dev_data)
        .env("SLUICE_ADMIN_TOKEN", "dist-admin")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ureq::get(&format!("{url}/healthz")).call().is_err() {
        assert!(Instant::now() < deadline, "sluice dev did not answer");
        std::thread::sleep(Duration::from_millis(200));
    }
    let as_user = |args: &[&str], key: Option<&str>| {
        let mut c = user(&sluice, &tmp_path);
        c.args(args).env("SLUICE_URL", &url).env("SLUICE_ADMIN_TOKEN", "dist-admin");
        if let Some(k) = key {
            c.env("SLUICE_API_KEY", k);
        }
        c.output().unwrap()
    };
    let key = ok(as_user(&["tenant", "create", "author", "--key-only"], None), "tenant create").trim().to_string();
    for (nf, file) in &built {
        ok(
            as_user(&["nf", "upload", file.to_str().unwrap(), "--version", "1.0.0"], Some(&key)),
            &format!("upload {nf}"),
        );
    }
    let config = tmp_path.join("fw.conf");
    std::fs::write(&config, "inside=10.0.0.0/8").unwrap();
    let out = ok(
        as_user(&["deploy", "fw", "-m", "fw-rust@1.0.0", "--config-file", config.to_str().unwrap()], Some(&key)),
        "deploy",
    );
    assert!(out.contains("running"), "{out}");
    // The manifest's way: `nf deploy` uploads the project's version and
    // deploys it with sluice.toml's configuration.
    let project = projects.join("fw-c");
    let o = as_user(&["nf", "deploy", project.to_str().unwrap()], Some(&key));
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "nf deploy: {said}");
    assert!(said.contains("uploaded fw-c@0.1.0") && said.contains("running"), "{said}");
    // Python and JavaScript builds are reproducible: deploying an
    // unchanged project again (rebuilt from its sources) keeps its version
    // and its deployment's revision.
    for lang in ["python", "js"] {
        let project = projects.join(format!("fw-{lang}"));
        let first = as_user(&["nf", "deploy", project.to_str().unwrap()], Some(&key));
        let said = text(&first);
        assert!(first.status.success() && said.contains("running"), "nf deploy ({lang}): {said}");
        let built_once = std::fs::read(project.join(format!("build/fw-{lang}.wasm"))).unwrap();
        let again = as_user(&["nf", "deploy", project.to_str().unwrap()], Some(&key));
        let said_again = text(&again);
        assert!(again.status.success(), "nf deploy again ({lang}): {said_again}");
        assert!(said_again.contains("already on the gateway"), "{said_again}");
        assert_eq!(
            std::fs::read(project.join(format!("build/fw-{lang}.wasm"))).unwrap(),
            built_once,
            "{lang}: the same sources built other bytes"
        );
    }
    let _ = Command::new("kill").args(["-TERM", &dev.id().to_string()]).status();
    let _ = dev.wait();
}

/// The paths the tenant's documentation and the binaries' `--help` name
/// (`docs/run-report.md`, `tests/conformance/guard`, ...), each checked to
/// be under the tarball's `share/doc/sluice/` or its SDK. The README names
/// the repository's sources too (it is also the checkout's); of it only
/// documentation, examples and the contract are checked.
fn check_named_paths(prefix: &Path, sluice: &Path, user: &dyn Fn(&Path, &Path) -> Command) {
    let doc = prefix.join("share/doc/sluice");
    let mut texts: Vec<(String, String, bool)> = Vec::new();
    for entry in std::fs::read_dir(doc.join("sdk")).unwrap() {
        let readme = entry.unwrap().path().join("README.md");
        texts.push((readme.display().to_string(), std::fs::read_to_string(&readme).unwrap(), true));
    }
    for f in ["docs/run-report.md", "wit/README.md"] {
        texts.push((f.to_string(), std::fs::read_to_string(doc.join(f)).unwrap(), true));
    }
    texts.push(("README.md".into(), std::fs::read_to_string(doc.join("README.md")).unwrap(), false));
    let host = prefix.join("bin/sluice-host");
    let host: &Path = &host;
    for (program, args) in [
        (sluice, &["nf", "run", "--help"][..]),
        (sluice, &["nf", "test", "--help"]),
        (sluice, &["dev", "--help"]),
        (host, &["run", "--help"]),
        (host, &["synth", "--help"]),
    ] {
        let out = ok(user(program, prefix).args(args).output().unwrap(), "--help");
        texts.push((format!("{} {}", program.display(), args.join(" ")), out, true));
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for (source, text, all) in &texts {
        for token in text.split(|c: char| !(c.is_ascii_alphanumeric() || "_./<>*{}@-".contains(c))) {
            let token = token.trim_start_matches("./").trim_end_matches(['.', ',']);
            let documentation =
                ["docs/", "deploy/local/", "tests/conformance", "wit/"].iter().any(|p| token.starts_with(p))
                    || (token.starts_with("sdk/") || token.starts_with("nfs-wasm/")) && token.ends_with("README.md");
            let any = ["sdk/", "nfs-wasm/", "deploy/"].iter().any(|p| token.starts_with(p));
            if !(documentation || *all && any) || token.contains(['<', '>', '*', '{', '}']) {
                continue;
            }
            checked += 1;
            if !doc.join(token).exists() && !prefix.join("share/sluice").join(token).exists() {
                missing.push(format!("{token} (named in {source})"));
            }
        }
    }
    assert!(checked > 20, "only {checked} paths found in the documentation");
    assert!(missing.is_empty(), "the tarball lacks what its documentation names: {missing:#?}");
}
