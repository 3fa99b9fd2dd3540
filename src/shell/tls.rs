//! The TLS client configuration: webpki roots plus any private CAs the
//! operator configures. A certificate that does not verify is a failed
//! connection, never a downgrade to plain `ws://`.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

use crate::shell::ShellError;

/// Builds the shared client config from webpki-roots and `extra_ca_files` (PEM).
pub(crate) fn client_config(
    extra_ca_files: &[impl AsRef<Path>],
) -> Result<Arc<ClientConfig>, ShellError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for file in extra_ca_files {
        let file = file.as_ref();
        let certs = CertificateDer::pem_file_iter(file).map_err(|e| ca_file_error(file, e))?;
        let mut added = 0;
        for cert in certs {
            let cert = cert.map_err(|e| ca_file_error(file, e))?;
            roots.add(cert).map_err(|e| ca_file_error(file, e))?;
            added += 1;
        }
        if added == 0 {
            return Err(ca_file_error(file, "no certificates found"));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ShellError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// `file` could not be read, parsed or added as a root; an operator's file,
/// so the error is about the data in it.
fn ca_file_error(
    file: &Path,
    error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> ShellError {
    ShellError::CaFile {
        path: file.to_owned(),
        error: io::Error::new(io::ErrorKind::InvalidData, error),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_ca_file_is_a_ca_file_error_naming_the_file() {
        let missing = std::env::temp_dir().join("grasp-sync-no-such-ca.pem");
        let Err(ShellError::CaFile { path, .. }) = client_config(&[&missing]) else {
            panic!("a missing file is a CA file error");
        };
        assert_eq!(path, missing);
        let empty =
            std::env::temp_dir().join(format!("grasp-sync-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, "no PEM here\n").unwrap();
        let result = client_config(&[&empty]);
        std::fs::remove_file(&empty).unwrap();
        let Err(e @ ShellError::CaFile { .. }) = result else {
            panic!("a file without certificates is a CA file error");
        };
        assert_eq!(
            e.to_string(),
            format!("tls: {}: no certificates found", empty.display())
        );
        assert!(client_config(&[] as &[&Path]).is_ok());
    }
}
