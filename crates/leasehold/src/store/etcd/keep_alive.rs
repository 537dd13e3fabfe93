//! A lease's keep-alive stream, one per session of a handle (see
//! `EtcdKeys::keep_alive_on`, which reopens it on another member).

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::client::Link;
use super::pb;

/// A lease's keep-alive stream: requests go out on `requests`, replies come
/// back on `replies`, one for one.
pub(super) struct KeepAlive {
    id: i64,
    /// The member the stream goes to.
    member: usize,
    requests: mpsc::Sender<pb::LeaseKeepAliveRequest>,
    replies: Streaming<pb::LeaseKeepAliveResponse>,
    /// The request sent with the stream's opening awaits its reply.
    primed: bool,
}

impl KeepAlive {
    /// Opens the stream for lease `id`. The first request goes out with the
    /// opening: etcd answers the call only once it has one to answer.
    pub(super) async fn open(link: Link, id: i64, member: usize) -> Result<Self, Status> {
        let (requests, outgoing) = mpsc::channel(1);
        // The channel has room for this one request and its receiver is alive.
        let _ = requests.try_send(pb::LeaseKeepAliveRequest { id });
        let replies = pb::lease_client::LeaseClient::new(link.channel())
            .lease_keep_alive(link.request(ReceiverStream::new(outgoing)))
            .await?
            .into_inner();
        Ok(KeepAlive {
            id,
            member,
            requests,
            replies,
            primed: true,
        })
    }

    /// The member the stream goes to.
    pub(super) fn member(&self) -> usize {
        self.member
    }

    /// One round trip; the TTL etcd reports (0 or less: the lease is gone),
    /// or `None` if the stream broke.
    pub(super) async fn once(&mut self) -> Option<i64> {
        if !std::mem::take(&mut self.primed) {
            self.requests
                .send(pb::LeaseKeepAliveRequest { id: self.id })
                .await
                .ok()?;
        }
        match self.replies.message().await {
            Ok(Some(reply)) => Some(reply.ttl),
            Ok(None) | Err(_) => None,
        }
    }
}
