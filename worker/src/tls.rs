//! `wss://`: public certificates are checked against the Mozilla roots built into the binary
//! (webpki-roots); `--ca-cert` trusts a private CA instead (as curl's `--cacert` does).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the CA certificate {path}: {source}")]
    Read {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)")]
    Empty(PathBuf),
    #[error("{path} is not a usable CA certificate: {source}")]
    Invalid {
        path: PathBuf,
        source: rustls::Error,
    },
}

/// A client configuration that trusts exactly the certificates in the PEM file `ca_cert`.
pub fn trusting(ca_cert: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let certs = CertificateDer::pem_file_iter(ca_cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Read {
            path: ca_cert.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty(ca_cert.to_owned()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|source| TlsError::Invalid {
            path: ca_cert.to_owned(),
            source,
        })?;
    }
    Ok(Arc::new(
        ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}
