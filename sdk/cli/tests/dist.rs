//! The release tarball (`make dist`, deploy/dist/build.sh) as a new user
//! meets it: unpacked into an empty directory, `HOME` a fresh folder, no
//! checkout on `PATH` or in any setting; `sluice nf new`, `nf build` and `nf test` in
//! all five languages from the SDK it carries (installed under the user's
//! data directory, which the projects reference), and every component
//! uploaded to a `sluice dev` started from the tarball, one of them
//! deployed and running. The wheel installs with pip and the npm package
//! is a package.

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
        "share/sluice/wit/v0.3.0/nf.wit",
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
    let data = home.join(".local/share/sluice/sdk").join(version);
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
        // What the project names is the installed copy, never a checkout
        // or the unpacked tarball.
        for f in ["Cargo.toml", "go.mod", "jsconfig.json", "README.md"] {
            if let Ok(t) = std::fs::read_to_string(project.join(f)) {
                assert!(!t.contains(ws.to_str().unwrap()), "{lang} {f} names the checkout: {t}");
                assert!(!t.contains(prefix.to_str().unwrap()), "{lang} {f} names the tarball: {t}");
                assert!(t.contains(data.to_str().unwrap()), "{lang} {f} does not name the installed SDK: {t}");
            }
        }
        let o = user(&sluice, &project)
            .args(["nf", "build", "--cargo-target-dir", cargo_target.to_str().unwrap()])
            .output()
            .unwrap();
        let out = ok(o, &format!("nf build ({lang})"));
        assert!(out.contains("sluice:nf@0.3.0"), "{out}");
        let o = user(&sluice, &project)
            .args(["nf", "test", "--cargo-target-dir", cargo_target.to_str().unwrap()])
            .output()
            .unwrap();
        let out = ok(o, &format!("nf test ({lang})"));
        assert!(out.contains("1 passed, 0 failed"), "{out}");
        built.push((nf.clone(), project.join("build").join(format!("{nf}.wasm"))));
    }
    assert!(data.join("sdk/rust/vendor/sluice-wire/Cargo.toml").is_file());

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
    let _ = Command::new("kill").args(["-TERM", &dev.id().to_string()]).status();
    let _ = dev.wait();
}
