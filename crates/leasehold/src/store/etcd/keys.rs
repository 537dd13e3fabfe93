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
        self.members
            .call(what, |link| {
                let txn = txn.clone();
                async move {
                    pb::kv_client::KvClient::new(link.channel())
                        .txn(link.request(txn))
                        .await
                }
            })
            .await
    }
}
