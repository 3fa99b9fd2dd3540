//! The TLS client configuration: webpki roots plus any private CAs the
//! operator configures. A certificate that does not verify is a failed
//! connection, never a downgrade to plain `ws://`.

use std::io::{self, Read, Write};
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
/// engine's client connections (over rustls's unbuffered API) and the
/// test relays' server connections (rustls's `StreamOwned`).
pub enum MaybeTls<S, T> {
    /// `ws://`.
    Plain(T),
    /// `wss://`.
    Tls(Box<S>),
}

/// A TLS session layered over a transport `T`.
pub trait OverTransport<T> {
    /// The transport under the session.
    fn transport_mut(&mut self) -> &mut T;
}

impl<C, T: Read + Write> OverTransport<T> for rustls::StreamOwned<C, T> {
    fn transport_mut(&mut self) -> &mut T {
        &mut self.sock
    }
}

impl<S: OverTransport<T>, T> MaybeTls<S, T> {
    /// The transport under any TLS.
    pub fn transport_mut(&mut self) -> &mut T {
        match self {
            MaybeTls::Plain(s) => s,
            MaybeTls::Tls(s) => s.transport_mut(),
        }
    }
}

impl<S: Read, T: Read> Read for MaybeTls<S, T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            MaybeTls::Plain(s) => s.read(buf),
            MaybeTls::Tls(s) => s.read(buf),
        }
    }
}

impl<S: Write, T: Write> Write for MaybeTls<S, T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            MaybeTls::Plain(s) => s.write(buf),
            MaybeTls::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
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
