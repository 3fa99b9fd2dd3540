//! The TLS client configuration: webpki roots plus any private CAs the
//! operator configures. A certificate that does not verify is a failed
//! connection, never a downgrade to plain `ws://`.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

/// Builds the shared client config from webpki-roots and `extra_ca_files` (PEM).
pub fn client_config(extra_ca_files: &[impl AsRef<Path>]) -> Result<Arc<ClientConfig>, String> {
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
