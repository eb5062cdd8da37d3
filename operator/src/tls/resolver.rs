//! The serving certificate as rustls sees it: swappable at run time without touching
//! established connections (rustls only consults the resolver during a handshake).
use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsError;

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    cert_pem: String,
}

/// A [`ResolvesServerCert`] whose certificate can be replaced while the server runs.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: RwLock<Option<Loaded>>,
}

impl CertResolver {
    /// An empty resolver: handshakes fail until [`CertResolver::set_pem`] succeeds.
    pub fn new() -> Arc<CertResolver> {
        Arc::new(CertResolver::default())
    }

    /// Replaces the served certificate chain (leaf first) and key. On error the previous
    /// certificate stays in place.
    pub fn set_pem(&self, cert_chain_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let chain = CertificateDer::pem_slice_iter(cert_chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::ParsePem {
                what: "serving certificate",
                reason: e.to_string(),
            })?;
        if chain.is_empty() {
            return Err(TlsError::ParsePem {
                what: "serving certificate",
                reason: "no CERTIFICATE block".into(),
            });
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::ParsePem {
                what: "serving key",
                reason: e.to_string(),
            })?;
        // from_der also checks that the key belongs to the leaf, so a torn update (new
        // certificate, old key) can never be served.
        let certified = CertifiedKey::from_der(chain, key, &provider())
            .map_err(|source| TlsError::LoadServingKey { source })?;
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        *current = Some(Loaded {
            key: Arc::new(certified),
            cert_pem: cert_chain_pem.to_string(),
        });
        Ok(())
    }

    /// Whether a certificate has been loaded.
    pub fn is_loaded(&self) -> bool {
        self.read(|l| l.is_some())
    }

    /// The PEM passed to the last successful [`CertResolver::set_pem`].
    pub fn current_cert_pem(&self) -> Option<String> {
        self.read(|l| l.map(|l| l.cert_pem.clone()))
    }

    fn read<T>(&self, f: impl FnOnce(Option<&Loaded>) -> T) -> T {
        // A writer that panicked mid-assignment cannot leave a half-written Option<Loaded>,
        // so a poisoned lock is still safe to read.
        let guard = self.current.read().unwrap_or_else(|p| p.into_inner());
        f(guard.as_ref())
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.read(|l| l.map(|l| l.key.clone()))
    }
}

fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// A server configuration presenting whatever `resolver` holds: TLS 1.2 and 1.3 with the
/// ring provider, no client authentication, ALPN h2 then http/1.1.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<rustls::ServerConfig, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| TlsError::BuildServerConfig { source })?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::{Duration, SystemTime};

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio_rustls::client::TlsStream;
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    use super::*;
    use crate::tls::config::San;
    use crate::tls::pki::{self, CertKeyPem};

    fn issue(validity: Duration) -> (CertKeyPem, CertKeyPem) {
        let now = SystemTime::now();
        let ca = pki::generate_ca(now, validity).unwrap();
        let sans = [
            San::Dns("gatehouse.gatehouse-system.svc".into()),
            San::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ];
        let serving = pki::issue_serving(&ca, &sans, now, validity).unwrap();
        (ca, serving)
    }

    /// Accepts one TLS connection on a fresh duplex pipe and echoes until EOF.
    fn serve_one(acceptor: &TlsAcceptor) -> DuplexStream {
        let (client, server) = tokio::io::duplex(4096);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(server).await else {
                return;
            };
            let mut buf = [0u8; 64];
            while let Ok(n) = tls.read(&mut buf).await {
                if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                let _ = tls.flush().await;
            }
        });
        client
    }

    async fn connect(
        acceptor: &TlsAcceptor,
        ca_pem: &str,
        name: &str,
        version: &'static rustls::SupportedProtocolVersion,
    ) -> Result<TlsStream<DuplexStream>, std::io::Error> {
        let mut roots = rustls::RootCertStore::empty();
        for der in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(der.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let connector = TlsConnector::from(Arc::new(config));
        let name = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
        connector.connect(name, serve_one(acceptor)).await
    }

    async fn echo(stream: &mut TlsStream<DuplexStream>, msg: &[u8]) {
        stream.write_all(msg).await.unwrap();
        stream.flush().await.unwrap();
        let mut buf = vec![0u8; msg.len()];
        stream.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, msg);
    }

    fn presented(stream: &TlsStream<DuplexStream>) -> Vec<u8> {
        stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    }

    #[tokio::test]
    async fn swap_serves_the_new_certificate_and_keeps_old_connections() {
        let (ca1, s1) = issue(Duration::from_secs(3600));
        let (ca2, s2) = issue(Duration::from_secs(3600));
        let resolver = CertResolver::new();
        let acceptor = TlsAcceptor::from(Arc::new(server_config(resolver.clone()).unwrap()));

        // Nothing loaded: the handshake is refused rather than served with no certificate.
        assert!(!resolver.is_loaded());
        let v13 = &rustls::version::TLS13;
        let v12 = &rustls::version::TLS12;
        assert!(
            connect(&acceptor, &ca1.cert_pem, "127.0.0.1", v13)
                .await
                .is_err()
        );

        resolver.set_pem(&s1.cert_pem, &s1.key_pem).unwrap();
        assert!(resolver.is_loaded());
        assert_eq!(
            resolver.current_cert_pem().as_deref(),
            Some(s1.cert_pem.as_str())
        );
        let name = "gatehouse.gatehouse-system.svc";
        let mut before = connect(&acceptor, &ca1.cert_pem, name, v13).await.unwrap();
        assert_eq!(before.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        echo(&mut before, b"before swap").await;
        let mut before12 = connect(&acceptor, &ca1.cert_pem, "127.0.0.1", v12)
            .await
            .unwrap();
        echo(&mut before12, b"tls 1.2").await;

        resolver.set_pem(&s2.cert_pem, &s2.key_pem).unwrap();
        assert_eq!(
            resolver.current_cert_pem().as_deref(),
            Some(s2.cert_pem.as_str())
        );

        // Connections established before the swap are not disturbed.
        echo(&mut before, b"after swap, same connection").await;
        echo(&mut before12, b"after swap, tls 1.2").await;
        // New handshakes get the new certificate: trusted via the new CA only.
        assert!(connect(&acceptor, &ca1.cert_pem, name, v13).await.is_err());
        let mut after = connect(&acceptor, &ca2.cert_pem, name, v13).await.unwrap();
        echo(&mut after, b"new connection").await;
        let leaf2 = CertificateDer::from_pem_slice(s2.cert_pem.as_bytes()).unwrap();
        assert_eq!(presented(&after), leaf2.to_vec());
        let mut after12 = connect(&acceptor, &ca2.cert_pem, "127.0.0.1", v12)
            .await
            .unwrap();
        echo(&mut after12, b"new tls 1.2 connection").await;
    }

    #[test]
    fn bad_material_is_rejected_and_the_old_certificate_stays() {
        let (_, s1) = issue(Duration::from_secs(3600));
        let (_, s2) = issue(Duration::from_secs(3600));
        let resolver = CertResolver::new();
        resolver.set_pem(&s1.cert_pem, &s1.key_pem).unwrap();
        assert!(matches!(
            resolver.set_pem(&s2.cert_pem, &s1.key_pem),
            Err(TlsError::LoadServingKey { .. })
        ));
        assert!(matches!(
            resolver.set_pem("not pem", &s2.key_pem),
            Err(TlsError::ParsePem { .. })
        ));
        assert!(matches!(
            resolver.set_pem(&s2.cert_pem, "not pem"),
            Err(TlsError::ParsePem { .. })
        ));
        assert_eq!(
            resolver.current_cert_pem().as_deref(),
            Some(s1.cert_pem.as_str())
        );
    }
}
