//! Notifications: the connection that listens, whose notices wake the
//! primitive's watches.

use super::*;
use crate::mutex::lock;

/// Keeps one connection LISTENing on the store's channel and hands what it
/// hears to the watches (`heard.rs`); after every (re)connection they read
/// again, since notifications sent meanwhile were lost.
pub(super) async fn listen(inner: std::sync::Weak<Inner>, stop: CancellationToken) {
    loop {
        let Some(store) = inner.upgrade() else { return };
        let (connector, what, channel, recent) = (
            store.connector.clone(),
            format!("listen on {}", store.display),
            store.channel.clone(),
            Arc::clone(&store.recent),
        );
        let revision = format!("SELECT value FROM {}", store.table("revision"));
        drop(store);
        let connected = connector.connect(&what).await;
        if let Err(error) = &connected {
            tracing::debug!(%error, "the postgres listener could not connect; retrying");
        }
        if let Ok((client, mut connection)) = connected {
            let forward = forward(&mut connection, &recent);
            // Runs while `forward` drives the connection.
            let listening = async {
                if client
                    .batch_execute(&format!("LISTEN {channel}"))
                    .await
                    .is_ok()
                    && let Ok(row) = client.query_one(&revision, &[]).await
                {
                    // Every change after this revision is heard from now;
                    // every watch is told to read again.
                    lock(&recent).listening_after(row.get(0));
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = forward => {}
                () = listening => {}
            }
            // Lost the connection: whatever happened meanwhile is unknown,
            // and nothing is heard until it is back.
            lock(&recent).deaf(format!(
                "postgres {what}: the connection is lost, changes are not heard"
            ));
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// Drives the listening connection, handing each notice to the watches,
/// until it ends.
async fn forward<S, T>(
    connection: &mut tokio_postgres::Connection<S, T>,
    recent: &std::sync::Mutex<heard::Recent>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(n))) => lock(recent).heard(&Arc::from(n.payload())),
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return,
        }
    }
}
