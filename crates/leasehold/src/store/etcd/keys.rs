//! The two requests of the key-value service every use of the store goes
//! through: a read of a range and a transaction, on whichever member
//! answers.

use super::*;

impl EtcdKeys {
    pub(super) async fn range_of(
        &self,
        what: &str,
        range: RangeRequest,
    ) -> Result<pb::RangeResponse, EtcdError> {
        self.members
            .call(what, |link| {
                let range = range.clone();
                async move {
                    pb::kv_client::KvClient::new(link.channel())
                        .range(link.request(range))
                        .await
                }
            })
            .await
    }

    pub(super) async fn txn(&self, what: &str, txn: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.txn_counted(what, txn).await.map(|(done, _)| done)
    }

    /// As [`Self::txn`], and whether it was sent more than once: an
    /// earlier attempt went unanswered or failed, so that it may have been
    /// carried out, its answer lost.
    pub(super) async fn txn_counted(
        &self,
        what: &str,
        txn: TxnRequest,
    ) -> Result<(TxnResponse, bool), EtcdError> {
        let sent = std::sync::atomic::AtomicUsize::new(0);
        let done = self
            .members
            .call(what, |link| {
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let txn = txn.clone();
                async move {
                    pb::kv_client::KvClient::new(link.channel())
                        .txn(link.request(txn))
                        .await
                }
            })
            .await?;
        Ok((done, sent.into_inner() > 1))
    }
}
