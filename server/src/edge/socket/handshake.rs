//! The WebSocket opening handshake, server side (RFC 6455 §4.2), done here rather than by
//! axum's extractor so the session gets the upgraded socket itself (see [`super::Connection`]).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::OnUpgrade;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// Checks a request asks for a WebSocket and answers it: the `101 Switching Protocols`
/// response, and the upgrade to await once it is sent. Anything else gets a 4xx saying why.
pub fn accept(req: &mut Request) -> Result<(Response, OnUpgrade), Refused> {
    if req.method() != Method::GET {
        return Err(refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "a WebSocket upgrade is a GET request",
        ));
    }
    let headers = req.headers();
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "Connection header did not include 'upgrade'",
        ));
    }
    if !has_token(headers, header::UPGRADE, "websocket") {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "Upgrade header did not include 'websocket'",
        ));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        return Err(refuse(StatusCode::UPGRADE_REQUIRED, WRONG_VERSION));
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "Sec-WebSocket-Key header missing",
        ));
    };
    let accept = derive_accept_key(key.as_bytes());
    let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
        return Err(refuse(
            StatusCode::UPGRADE_REQUIRED,
            "this connection cannot be upgraded (HTTP/1.1 is needed)",
        ));
    };
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .body(Body::empty())
        .expect("a valid response");
    Ok((response, on_upgrade))
}

const WRONG_VERSION: &str = "Sec-WebSocket-Version must be 13";

/// Why a request was not upgraded, as its 4xx response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub status: StatusCode,
    pub why: &'static str,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.why).into_response();
        if self.why == WRONG_VERSION {
            // RFC 6455 §4.4: say which version this server speaks.
            response.headers_mut().insert(
                header::SEC_WEBSOCKET_VERSION,
                HeaderValue::from_static("13"),
            );
        }
        response
    }
}

fn refuse(status: StatusCode, why: &'static str) -> Refused {
    Refused { status, why }
}

/// Whether a comma-separated header holds `token`, in any case.
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value
            .to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}
