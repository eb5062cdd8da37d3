//! A TLS client for talking to Gatehouse's webhook server the way the API server does: trusting
//! only the CA it is given, to 127.0.0.1.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::install_crypto_provider;

/// An HTTP/1.1 connection made by [`TlsClient::http1`].
pub type Http1 = SendRequest<Full<Bytes>>;

/// A TLS client that trusts only the CAs of one PEM bundle.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
}

/// A client trusting only the certificates in `ca_pem` (one or more PEM blocks).
pub fn tls_client(ca_pem: impl AsRef<[u8]>) -> anyhow::Result<TlsClient> {
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_ref()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsClient {
        config: Arc::new(config),
    })
}

impl TlsClient {
    /// Completes a TLS handshake with 127.0.0.1:`port`.
    pub async fn connect(&self, port: u16) -> anyhow::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        tcp.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
        Ok(tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, tcp)
            .await?)
    }

    /// An HTTP/1.1 connection over TLS to 127.0.0.1:`port`.
    pub async fn http1(&self, port: u16) -> anyhow::Result<Http1> {
        let stream = self.connect(port).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(sender)
    }
}
