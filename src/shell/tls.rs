//! The TLS client configuration: webpki roots plus any private CAs the
//! operator configures. A certificate that does not verify is a failed
//! connection, never a downgrade to plain `ws://`.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

/// Builds the shared client config from webpki-roots and `extra_ca_files` (PEM).
pub(crate) fn client_config(
    extra_ca_files: &[impl AsRef<Path>],
) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for file in extra_ca_files {
        let file = file.as_ref();
        let certs =
            CertificateDer::pem_file_iter(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut added = 0;
        for cert in certs {
            let cert = cert.map_err(|e| format!("{}: {e}", file.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", file.display()))?;
            added += 1;
        }
        if added == 0 {
            return Err(format!("{}: no certificates found", file.display()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A byte stream that is either plain or wrapped in TLS: one type for the
/// websocket layer whichever the URL's scheme asked for. Shared by the
/// engine's client connections and the test relays' server connections.
pub enum MaybeTls<C, T: std::io::Read + std::io::Write> {
    /// `ws://`.
    Plain(T),
    /// `wss://`.
    Tls(Box<rustls::StreamOwned<C, T>>),
}

impl<C, T: std::io::Read + std::io::Write> MaybeTls<C, T> {
    /// The transport under any TLS.
    pub fn transport_mut(&mut self) -> &mut T {
        match self {
            MaybeTls::Plain(s) => s,
            MaybeTls::Tls(s) => &mut s.sock,
        }
    }
}

impl<C, T: std::io::Read + std::io::Write> std::io::Read for MaybeTls<C, T>
where
    rustls::StreamOwned<C, T>: std::io::Read,
{
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            MaybeTls::Plain(s) => s.read(buf),
            MaybeTls::Tls(s) => s.read(buf),
        }
    }
}

impl<C, T: std::io::Read + std::io::Write> std::io::Write for MaybeTls<C, T>
where
    rustls::StreamOwned<C, T>: std::io::Write,
{
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            MaybeTls::Plain(s) => s.write(buf),
            MaybeTls::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            MaybeTls::Plain(s) => s.flush(),
            MaybeTls::Tls(s) => s.flush(),
        }
    }
}
