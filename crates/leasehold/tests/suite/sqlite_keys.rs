//! The store primitive on SQLite (`SqliteKeys`), each case in a database
//! of its own; every handle opens the file anew. (A key of a
//! killed process's session is in `sqlite_crash.rs`.)

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::store::sqlite::{SqliteKeys, SqliteStore};
use leasehold::testing::keys::KeysHarness;

struct Sqlite {
    dir: tempfile::TempDir,
}

async fn sqlite() -> Sqlite {
    Sqlite {
        dir: tempfile::tempdir().expect("temp dir"),
    }
}

impl Sqlite {
    fn keys(&self) -> SqliteKeys {
        SqliteStore::open(self.dir.path().join("keys.db"))
            .expect("open")
            .keys()
    }
}

#[async_trait]
impl KeysHarness for Sqlite {
    type Keys = SqliteKeys;

    async fn open(&self) -> Arc<SqliteKeys> {
        Arc::new(self.keys())
    }
}

leasehold::keys_conformance_tests!(sqlite());

/// The elections written once over the primitive, on SQLite.
mod elections {
    use std::path::PathBuf;

    use super::*;
    use leasehold::store::Store;
    use leasehold::store::keyed::KeyedStore;
    use leasehold::testing::StoreHarness;

    struct Keyed {
        _dir: tempfile::TempDir,
        path: PathBuf,
    }

    #[async_trait]
    impl StoreHarness for Keyed {
        async fn open(&self) -> Arc<dyn Store> {
            let store = SqliteStore::open(&self.path).expect("open");
            Arc::new(KeyedStore::over(store.keys()))
        }

        fn durable(&self) -> bool {
            true
        }

        fn campaigns_unwaited(&self) -> bool {
            true
        }
    }

    async fn keyed() -> Keyed {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("keyed.db");
        Keyed { _dir: dir, path }
    }

    leasehold::conformance_tests!(keyed());
}
