//! The suite's own configuration, held against the tests: the `heavy` test group that
//! cargo-nextest runs one at a time (`.config/nextest.toml`) is exactly the integration
//! tests that take the heavy lock (`util::heavy`).

use std::collections::BTreeSet;
use std::path::Path;

/// `module::name` of every test in `tests/integration/` whose body takes `heavy()`.
fn heavy_in_source() -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/integration");
    let mut heavy = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("the tests' folder") {
        let path = entry.expect("an entry").path();
        let module = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        if module == "suite" {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("a test file");
        // A test: an `async fn` after a `#[tokio::test]`; its body runs to the next `fn`.
        let mut parts = source.split("#[tokio::test").skip(1);
        for part in parts.by_ref() {
            let Some(at) = part.find("async fn ") else {
                continue;
            };
            let rest = &part[at + "async fn ".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let end = [
                "\nfn ",
                "\nasync fn ",
                "\npub fn ",
                "\npub async fn ",
                "\npub(crate) ",
            ]
            .iter()
            .filter_map(|next| rest.find(next))
            .min()
            .unwrap_or(rest.len());
            if rest[..end].contains("heavy().await") {
                heavy.insert(format!("{module}::{name}"));
            }
        }
    }
    heavy
}

/// The names the `heavy` group's filter lists (`test(=module::name)`).
fn heavy_in_config() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.config/nextest.toml");
    let config = std::fs::read_to_string(path).expect(".config/nextest.toml");
    config
        .split("test(=")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_heavy_group_is_the_tests_that_take_the_heavy_lock() {
    let (source, config) = (heavy_in_source(), heavy_in_config());
    assert!(source.len() > 10, "{source:?}");
    let missing: Vec<_> = source.difference(&config).collect();
    let stale: Vec<_> = config.difference(&source).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "take heavy() but are not in .config/nextest.toml's heavy group: {missing:?}; \
         in the group but take no heavy(): {stale:?}"
    );
}
