//! The store primitive on SQLite (`SqliteKeys`), each case in a database
//! of its own; every handle opens the file anew. (The elections over it,
//! `SqliteStore`, run the whole conformance suite in `sqlite.rs`; a key of
//! a killed process's session is in `sqlite_crash.rs`.)

use std::sync::Arc;

use async_trait::async_trait;
use leasehold::backend::sqlite::SqliteKeys;
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
        SqliteKeys::open(self.dir.path().join("keys.db")).expect("open")
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
