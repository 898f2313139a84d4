//! The volunteer page and the wasm worker, built into the binary (see `build.rs`), or read
//! from `--web-dir` for people editing the page.

use std::path::{Path, PathBuf};

use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tower_http::services::ServeDir;
use tracing::{info, warn};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));
}

/// The wasm module the page loads; without it the page cannot train.
const WASM: &str = "pkg/worker_wasm_bg.wasm";

/// The command that builds the wasm package, for messages.
pub const BUILD_COMMAND: &str =
    "wasm-pack build --target web --release --out-dir ../web/pkg worker-wasm (or scripts/run.sh, which also rebuilds the coordinator)";

/// Where the page comes from.
#[derive(Debug, Clone)]
pub enum WebSource {
    Embedded,
    Dir(PathBuf),
}

impl WebSource {
    pub fn new(dir: Option<PathBuf>) -> Self {
        dir.map_or(Self::Embedded, Self::Dir)
    }

    /// Says where the page comes from, and warns if the wasm worker is missing.
    pub fn announce(&self) {
        match self {
            Self::Embedded if embedded::PKG_BUILT => {
                info!(
                    files = embedded::ASSETS.len(),
                    relaxed_simd = embedded::RELAXED_BUILT,
                    "serving the page built into the binary"
                );
                if !embedded::RELAXED_BUILT {
                    info!("no build with relaxed SIMD (web/pkg-relaxed): every tab computes unfused; scripts/run.sh builds both");
                }
            }
            Self::Embedded => warn!(
                "this coordinator was built before the wasm worker: browsers get the page but cannot train. Build it with {BUILD_COMMAND}, then rebuild the coordinator"
            ),
            Self::Dir(dir) if dir.join(WASM).is_file() => {
                info!(dir = %dir.display(), "serving the page from --web-dir");
            }
            Self::Dir(dir) => warn!(
                dir = %dir.display(),
                "--web-dir has no {WASM}: browsers get the page but cannot train. Build it with {BUILD_COMMAND}"
            ),
        }
    }

    /// Adds the page as the router's fallback.
    pub fn serve(&self, router: Router) -> Router {
        match self {
            Self::Embedded => router.fallback(embedded_file),
            Self::Dir(dir) => {
                let missing = ServeDir::new(dir).fallback(get(missing_from_dir));
                router.fallback_service(missing)
            }
        }
    }
}

/// A file of the page by its path, `index.html` for `/`.
pub fn lookup(path: &str) -> Option<&'static [u8]> {
    let path = path.trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    embedded::ASSETS
        .iter()
        .find(|(name, _)| *name == path)
        .map(|(_, bytes)| *bytes)
}

async fn embedded_file(uri: Uri) -> Response {
    let path = uri.path();
    match lookup(path) {
        Some(bytes) => ([(header::CONTENT_TYPE, content_type(path))], bytes).into_response(),
        None if path.starts_with("/pkg/") && !embedded::PKG_BUILT => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the wasm worker was not built into this coordinator: run {BUILD_COMMAND}, then rebuild the coordinator\n"),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "not found\n").into_response(),
    }
}

/// A file `--web-dir` lacks: the wasm package gets the sentence that says how to build it.
async fn missing_from_dir(uri: Uri) -> Response {
    if uri.path().starts_with("/pkg/") {
        let message = format!(
            "--web-dir has no {}: the wasm worker was not built. Run {BUILD_COMMAND}\n",
            uri.path().trim_start_matches('/')
        );
        return (StatusCode::SERVICE_UNAVAILABLE, message).into_response();
    }
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

fn content_type(path: &str) -> &'static str {
    match Path::new(path).extension().and_then(|e| e.to_str()) {
        Some("html") | None => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ts") | Some("txt") | Some("md") => "text/plain; charset=utf-8",
        Some(_) => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_built_in_and_found_by_path() {
        let index = lookup("/").expect("index.html is embedded");
        assert!(
            String::from_utf8_lossy(index).contains("<html"),
            "an HTML page"
        );
        assert_eq!(lookup("/index.html"), Some(index));
        assert!(lookup("/worker.js").is_some() && lookup("/main.js").is_some());
        assert_eq!(lookup("/nope.js"), None);
        assert_eq!(content_type("/pkg/worker_wasm_bg.wasm"), "application/wasm");
        assert_eq!(content_type("/"), "text/html; charset=utf-8");
    }
}
