//! The coordinator serving https/wss itself (`--tls-cert`, `--tls-key`), with a private CA and
//! a server certificate the test generates (rcgen): a native worker trains over `wss://`
//! trusting that CA (`--ca-cert`), the page and API answer over https, and a client that
//! does not trust the CA, a plain `ws://` client and a stalled handshake are turned away
//! without disturbing anyone.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::util::*;

/// A private CA and a certificate it signed for `localhost` and 127.0.0.1, as PEM files.
struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ca = CertificateParams::new(Vec::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let leaf =
        CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).expect("leaf params");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf_cert = leaf
        .signed_by(&leaf_key, &issuer)
        .expect("leaf certificate");
    let write = |name: &str, pem: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).expect("write PEM");
        path
    };
    Pki {
        ca: write("ca.pem", ca_cert.pem()),
        cert: write("cert.pem", leaf_cert.pem()),
        key: write("key.pem", leaf_key.serialize_pem()),
        _dir: dir,
    }
}

async fn tls_server(pki: &Pki, flags: &[&str]) -> server::RunningServer {
    let (cert, key) = (
        pki.cert.to_str().expect("utf-8"),
        pki.key.to_str().expect("utf-8"),
    );
    let mut all = vec!["--tls-cert", cert, "--tls-key", key];
    all.extend(flags);
    start_server(&all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_worker_trains_over_wss_trusting_a_private_ca() {
    let pki = pki();
    let server = tls_server(&pki, &["--max-rounds", "20"]).await;
    let port = server.addr.port();
    let mut status = server.status.clone();

    // A client that stalls its handshake holds one slot, and nobody waits for it.
    let stalled = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("tcp");

    // Not trusting the private CA (the public roots): refused by the worker's own check.
    let untrusting = worker::Options {
        url: format!("wss://localhost:{port}/ws"),
        ..worker::Options::default()
    };
    let err = worker::run(&untrusting, CancellationToken::new())
        .await
        .expect_err("an unknown issuer is not trusted");
    assert!(
        format!("{err}").contains("certificate"),
        "the error says why: {err}"
    );
    // Plain ws:// to a TLS port: the handshake fails, the coordinator carries on.
    let plain = worker::Options {
        url: format!("ws://localhost:{port}/ws"),
        ..worker::Options::default()
    };
    assert!(worker::run(&plain, CancellationToken::new()).await.is_err());

    // Trusting it: trains to the end, over wss://, by name and by address.
    let mut honest = Vec::new();
    for host in ["localhost", "127.0.0.1"] {
        let options = worker::Options {
            url: format!("wss://{host}:{port}/ws"),
            tls: Some(worker::tls::trusting(&pki.ca).expect("CA loads")),
            ..worker::Options::default()
        };
        honest.push(tokio::spawn(async move {
            worker::run(&options, CancellationToken::new()).await
        }));
    }
    wait_status(&mut status, "rounds over wss", |s| s.round >= 5).await;
    assert_eq!(
        status.borrow().counters.sessions_rejected,
        0,
        "no honest refusal"
    );

    // https: the API answers, from a client that trusts the same CA.
    let body = https_get(&pki, port, "/api/status").await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("\"state\""), "{body}");

    let summary = guard("the run to finish", server.wait())
        .await
        .expect("clean end");
    assert_eq!(summary.rounds, 20);
    for task in honest {
        let (ended, stats) = guard("worker end", task)
            .await
            .expect("task")
            .expect("ran without error");
        assert!(closed_by_shutdown(&ended), "{ended:?}");
        assert!(stats.gradients_sent > 0);
    }
    drop(stalled);
}

/// `GET path` over https to 127.0.0.1:`port`, trusting the test CA; the whole response.
async fn https_get(pki: &Pki, port: u16, path: &str) -> String {
    let config = worker::tls::trusting(&pki.ca).expect("CA loads");
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("tcp");
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    // The server closes after the response (Connection: close); a TLS peer may skip
    // close_notify, which rustls reports as an error after the data.
    let _ = tls.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn bad_certificate_files_are_refused_with_a_clear_message() {
    let pki = pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").expect("write");
    let missing = dir.path().join("missing.pem");
    let cases = [
        (&missing, &pki.key, "missing.pem"),
        (&empty, &pki.key, "holds no certificate"),
        (&pki.cert, &empty, "private key"),
        // The CA's certificate with the leaf's key: they do not belong together.
        (&pki.ca, &pki.key, "do not make a TLS configuration"),
    ];
    for (cert, key, needle) in cases {
        let args = [
            "coordinator",
            "--port",
            "0",
            "--tls-cert",
            cert.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
        ];
        let config = server::Config::from_args(args).expect("flags parse");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let err = server::start(listener, config, std::future::pending())
            .await
            .expect_err("refused");
        assert!(format!("{err}").contains(needle), "{needle}: {err}");
    }
    let half = server::Config::from_args(["coordinator", "--tls-cert", "x.pem"]);
    assert!(half
        .expect_err("refused")
        .to_string()
        .contains("go together"));
}
