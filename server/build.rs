//! Embeds the volunteer page (web/) and the built wasm package (web/pkg/) in the binary, so
//! a coordinator copied anywhere serves them. Generates `$OUT_DIR/web_assets.rs`: a table of
//! `(path, bytes)` with `include_bytes!` of each file, and whether the package was built.
//! Cargo re-runs this when anything under web/ changes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("../web");
    println!("cargo:rerun-if-changed={}", web.display());
    let mut files = Vec::new();
    collect(&web, &web, &mut files);
    files.sort();
    let mut out = String::from(
        "/// Every file of web/, by its path below it.\npub static ASSETS: &[(&str, &[u8])] = &[\n",
    );
    for (rel, abs) in &files {
        writeln!(
            out,
            "    ({rel:?}, include_bytes!({:?})),",
            abs.display().to_string()
        )
        .expect("write to a String");
    }
    out.push_str("];\n");
    let built = files
        .iter()
        .any(|(rel, _)| rel == "pkg/worker_wasm_bg.wasm");
    writeln!(out, "/// web/pkg held the built wasm worker at build time.\npub const PKG_BUILT: bool = {built};")
        .expect("write to a String");
    let relaxed = files
        .iter()
        .any(|(rel, _)| rel == "pkg-relaxed/worker_wasm_bg.wasm");
    writeln!(out, "/// web/pkg-relaxed held its build with relaxed SIMD.\npub const RELAXED_BUILT: bool = {relaxed};")
        .expect("write to a String");
    if !built {
        println!("cargo:warning=web/pkg is not built: the coordinator will serve the page without its wasm worker. Build it with scripts/run.sh, or: wasm-pack build --target web --release --out-dir ../web/pkg worker-wasm");
    }
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(dest.join("web_assets.rs"), out).expect("write web_assets.rs");
}

/// Regular files below `dir`, skipping hidden ones (wasm-pack's .gitignore).
fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            collect(root, &path, files);
        } else if path.is_file() {
            let rel = path.strip_prefix(root).expect("below root");
            let rel = rel.to_string_lossy().replace('\\', "/");
            let abs = path.canonicalize().unwrap_or(path);
            files.push((rel, abs));
        }
    }
}
