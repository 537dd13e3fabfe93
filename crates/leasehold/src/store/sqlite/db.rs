//! Opening a database: the checks of its file and schema, the schema's
//! creation, and the connection every operation takes.

use super::*;

impl Db {
    pub(super) fn open(path: &Path, read_only: bool) -> Result<Self> {
        let existing = check_path(path, read_only)?;
        let me = nix::unistd::geteuid().as_raw();
        let mut owners = [existing.as_ref().map_or(me, MetadataExt::uid), me];
        // A notify file that leasehold did not create is refused before
        // anything is created or written.
        let mut notify = notify::checked(path, &owners, read_only)?;
        let exists = |suffix: &str| std::fs::symlink_metadata(sibling(path, suffix)).is_ok();
        check_siblings(path, &owners)?;
        let (wal_existed, shm_existed) = (exists("-wal"), exists("-shm"));
        if !read_only {
            notify = settle_new_database(path, &owners, notify)?;
        }
        let quiet = read_only && !in_use(path);
        if read_only && !quiet && !shm_existed {
            refuse_to_create_the_shm(path)?;
        }
        let conn = open_connection(path, read_only, quiet)?;
        let (file, meta) = hold_regular_file(path, read_only)?;
        let claim = names::claim(&file, path, read_only)?;
        owners[0] = meta.uid();
        let mut db = Db {
            path: path.to_owned(),
            opened: std::time::Instant::now(),
            link: None,
            conn: Mutex::new(conn),
            boot_id: boot_id(),
            read_only,
            owners,
            notify,
            liveness: None,
            id: FileId::of(&meta),
            file,
            replaced: CancellationToken::new(),
            why_replaced: OnceLock::new(),
            wal_emptied: AtomicBool::new(false),
            renewals: (Mutex::new(0), std::sync::Condvar::new()),
            wal_existed,
            shm_existed,
            verified: false,
            quiet: Mutex::new(None),
            claim,
        };
        if quiet {
            *lock(&db.quiet) = Quiet::of(&db.file);
        }
        db.prepare()?;
        // SQLite opened what the path named between the first look and now.
        db.check_file()?;
        if !read_only {
            db.take_up()?;
        }
        db.liveness = db.open_liveness();
        db.opened = std::time::Instant::now();
        Ok(db)
    }

    /// A writer's database, once known to be leasehold's: closing
    /// checkpoints it as usual, and the name is recorded (see `names`).
    pub(super) fn take_up(&mut self) -> Result<()> {
        self.conn()
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)
            .map_err(self.err())?;
        self.verified = true;
        match &self.claim {
            Some(claim) => {
                names::record(&self.conn(), claim, &self.path)?;
                names::share(&self.file, claim, &self.path)
            }
            None => Ok(()),
        }
    }

    /// The kernel's test of sessions' processes, on the notify file.
    pub(super) fn open_liveness(&self) -> Option<liveness::Liveness> {
        match &self.notify {
            Some(n) => liveness::Liveness::new(n.path().to_owned(), n.file()),
            // A read-only handle opens the notify file only to ask the
            // kernel (notes of waiters whose process died are not live);
            // it never takes a lock, and a session lock recorded on
            // another file is never tested.
            None if self.read_only => notify::open_for_reading(&self.path, &self.owners)
                .ok()
                .flatten()
                .and_then(|file| liveness::Liveness::new(notify::notify_path(&self.path), &file)),
            None => None,
        }
    }

    /// Checks what the file is before writing anything, then creates or
    /// accepts the schema.
    pub(super) fn prepare(&mut self) -> Result<()> {
        let identity = retry_busy(|| self.inspect())?;
        // A leasehold database that only a -wal killed processes left
        // holds: it is another file's (see `names`), unless this file
        // records it.
        if identity.version != 0
            && let Some(claim) = &self.claim
            && matches!(on_disk(&self.file), Ok(OnDisk::EmptyDatabase))
        {
            names::refuse_a_leftover(claim, &self.path)?;
        }
        if self.read_only {
            if identity.version == 0 {
                return Err(Error::NotFound(format!(
                    "at {}: the SQLite file holds no leasehold database yet; nothing was written",
                    self.path.display()
                )));
            }
            return Ok(());
        }
        if self.notify.is_none() {
            self.notify = notify::create(&self.path, &self.owners)?;
        }
        retry_busy(|| {
            let identity = self.inspect()?;
            self.settle(identity)
        })
    }

    /// `PRAGMA data_version` of this connection: it changes only when
    /// another connection commits. `None` if it cannot be read.
    pub(super) fn data_version(&self) -> Option<i64> {
        self.conn()
            .query_row("PRAGMA data_version", [], |row| row.get(0))
            .ok()
    }

    pub(super) fn conn(&self) -> MutexGuard<'_, Connection> {
        if self.read_only {
            self.reopen_if_stale();
        }
        // A renewal waiting goes first (bounded: it holds the connection
        // for one short transaction).
        let (waiting, turn) = &self.renewals;
        let waiting = waiting.lock().unwrap_or_else(|p| p.into_inner());
        drop(
            turn.wait_timeout_while(waiting, std::time::Duration::from_millis(100), |n| *n > 0)
                .unwrap_or_else(|p| p.into_inner()),
        );
        self.lock_conn()
    }

    /// A read-only handle's quiet connection, opened again when the file
    /// changed since (see [`Quiet`]): the usual way once a writer has the
    /// database open.
    pub(super) fn reopen_if_stale(&self) {
        let mut quiet = lock(&self.quiet);
        let Some(opened) = *quiet else {
            return;
        };
        let writer = in_use(&self.path);
        if !writer && Quiet::of(&self.file) == Some(opened) {
            return;
        }
        match open_connection(&self.path, true, !writer) {
            Ok(conn) => {
                *self.lock_conn() = conn;
                *quiet = if writer { None } else { Quiet::of(&self.file) };
            }
            Err(error) => {
                tracing::debug!(path = %self.path.display(), %error, "cannot open the database again; reading with the connection as it is");
            }
        }
    }

    pub(super) fn lock_conn(&self) -> MutexGuard<'_, Connection> {
        // rusqlite rolls back an open transaction when it is dropped during a
        // panic, so the connection is consistent even if the lock is poisoned.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection for a renewal, ahead of everything else waiting.
    pub(super) fn conn_for_renewal(&self) -> MutexGuard<'_, Connection> {
        let (waiting, turn) = &self.renewals;
        *waiting.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let conn = self.lock_conn();
        *waiting.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        turn.notify_all();
        conn
    }

    pub(super) fn err(&self) -> impl Fn(rusqlite::Error) -> Error + '_ {
        |e| sql_error(&self.path, e)
    }

    /// What the file holds, refusing — without writing — anything that is
    /// not a leasehold database or an empty file, first from the file's
    /// own bytes (before SQLite reads it), then through SQLite.
    pub(super) fn inspect(&self) -> Result<Identity> {
        let shown = self.path.display();
        let looked = |e: std::io::Error| Error::unavailable(format!("cannot read {shown}: {e}"), e);
        match on_disk(&self.file).map_err(looked)? {
            OnDisk::Empty if self.read_only => {
                return Err(Error::NotFound(format!(
                    "at {shown}: the file is empty; nothing was written"
                )));
            }
            // Without a -wal, SQLite would see the same empty database
            // (and a read-only open would leave a -wal and -shm behind).
            OnDisk::EmptyDatabase if self.read_only && !sibling(&self.path, "-wal").exists() => {
                return Err(Error::NotFound(format!(
                    "at {shown}: the SQLite file holds no leasehold database yet; nothing was written"
                )));
            }
            OnDisk::Empty | OnDisk::EmptyDatabase | OnDisk::Leasehold => {}
            OnDisk::NotSqlite => {
                return Err(Error::Corrupt(format!("{shown} is not a SQLite database")));
            }
            OnDisk::Other { app_id: 0 } => {
                return Err(Error::Corrupt(format!(
                    "{shown} is a SQLite database of another program (it has tables and no \
                     application id); point leasehold at its own file"
                )));
            }
            OnDisk::Other { app_id } => {
                return Err(Error::Corrupt(format!(
                    "{shown} is a SQLite database of another program (application id {app_id:#x})"
                )));
            }
        }
        // Reading the header fails with NOTADB on a file that is not SQLite;
        // nothing has been written at that point.
        let identity = read_identity(&self.conn()).map_err(self.err())?;
        self.check_identity(identity)?;
        if identity.app_id == APPLICATION_ID
            && !matches!(
                on_disk(&self.file).map_err(looked)?,
                OnDisk::Leasehold | OnDisk::EmptyDatabase
            )
        {
            return Err(Error::Corrupt(format!(
                "{shown}-wal holds leasehold data but {shown} itself is not a leasehold database: \
                 the file was deleted or replaced while a process had it open. Nothing was written; \
                 stop the processes still using the old file, then remove {shown}-wal and {shown}-shm"
            )));
        }
        Ok(identity)
    }

    /// Under the generation lock, creates the schema if the file has none;
    /// holds the lock shared from then on. The first handle of a file takes
    /// it exclusive first, a new file's or an existing one's (a backup moved
    /// onto the path): no file is used while a process still uses the file
    /// it replaced.
    pub(super) fn settle(&self, mut identity: Identity) -> Result<()> {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(2);
        let mut warned = false;
        let lock = |exclusive| -> Result<bool> {
            let Some(notify) = &self.notify else {
                return Ok(true);
            };
            notify.try_lock(exclusive).map_err(|e| {
                Error::unavailable(
                    format!("cannot lock {}-notify: {e}", self.path.display()),
                    e,
                )
            })
        };
        loop {
            let creating = identity.version == 0;
            let first = self
                .claim
                .as_ref()
                .is_some_and(|claim| !names::others_use(&self.file, claim));
            if lock(creating || first)? {
                break;
            }
            if !warned && started.elapsed() >= GENERATION_WARN {
                warned = true;
                tracing::warn!(
                    path = %self.path.display(),
                    up_to = ?GENERATION_WAIT,
                    "waiting for the processes that hold the notify file to let go (those of a database that was at this path before, or one creating this one)"
                );
            }
            if started.elapsed() >= GENERATION_WAIT {
                return Err(self.generation_refused(creating || first, creating));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
            identity = self.inspect()?;
        }
        let outcome = self.create_schema(identity);
        let shared = match &self.notify {
            Some(notify) => notify.share_lock(),
            None => Ok(()),
        };
        outcome?;
        shared.map_err(|e| {
            Error::unavailable(
                format!("cannot lock {}-notify: {e}", self.path.display()),
                e,
            )
        })
    }

    /// Why the file cannot be used after [`GENERATION_WAIT`]: an earlier
    /// file's processes still hold the generation lock (`alone`: this
    /// handle needed it alone), or another process still creates this one.
    fn generation_refused(&self, alone: bool, creating: bool) -> Error {
        let shown = self.path.display();
        let reason = if alone {
            format!(
                "{shown} is {}, but processes still use the database that was at this path \
                 before (it was deleted or replaced while they had it open); it is used only \
                 once they have stopped, which they do as soon as they notice",
                if creating {
                    "new"
                } else {
                    "another file than the one they use"
                }
            )
        } else {
            format!("{shown} is still being created by another process")
        };
        Error::Unavailable {
            reason,
            source: None,
        }
    }

    pub(super) fn create_schema(&self, identity: Identity) -> Result<()> {
        let mut conn = self.conn();
        let err = self.err();
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(&err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(&err)?;
        if identity.version == SCHEMA_VERSION {
            return Ok(());
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(&err)?;
        // Another process may have created the schema while we waited.
        let identity = read_identity(&tx).map_err(&err)?;
        self.check_identity(identity)?;
        if identity.version == 0 {
            tx.execute_batch(SCHEMA).map_err(&err)?;
            tx.execute_batch(names::TABLE).map_err(&err)?;
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(&err)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(&err)?;
        }
        self.check_file()?;
        tx.commit().map_err(&err)
    }

    /// Whether the path still names the file this handle opened; once it
    /// does not, this handle is dead ([`Error::Replaced`]).
    pub(super) fn check_file(&self) -> Result<()> {
        if self.replaced.is_cancelled() {
            return Err(self.replaced_error());
        }
        let linked = self.link.as_ref().map(std::fs::metadata);
        let why = match std::fs::metadata(&self.path) {
            Ok(_)
                if linked
                    .as_ref()
                    .is_some_and(|l| !matches!(l, Ok(m) if FileId::of(m) == self.id)) =>
            {
                "the symbolic link it was reached by names another file now"
            }
            Ok(meta) if FileId::of(&meta) == self.id => return Ok(()),
            Ok(_) => "another file is there now",
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                "it was deleted or moved away"
            }
            Err(error) => {
                return Err(Error::unavailable(
                    format!("cannot check {}: {error}", self.path.display()),
                    error,
                ));
            }
        };
        let _ = self.why_replaced.set(why);
        self.replaced.cancel();
        let message =
            "the database file this process opened is no longer at its path; not using it any more";
        if self.read_only {
            // A reader reports it in its error (`observe` exits saying so).
            tracing::debug!(path = %self.path.display(), why, "{message}");
        } else {
            tracing::warn!(path = %self.path.display(), why, "{message}");
        }
        Err(self.replaced_error())
    }

    pub(super) fn replaced_error(&self) -> Error {
        Error::Replaced(format!(
            "{} is no longer the database file this process opened ({}); nothing more is written \
             to either — open the store again",
            self.path.display(),
            self.why_replaced.get().copied().unwrap_or("replaced")
        ))
    }

    /// [`Db::check_file`] before using the connection; once the file was
    /// replaced, also empties this handle's `-wal` (see the module's
    /// documentation).
    pub(super) fn usable(&self, conn: &Connection) -> Result<()> {
        let checked = self.check_file();
        if let Err(Error::Replaced(_)) = &checked {
            self.empty_wal(conn);
        }
        checked
    }

    /// Checkpoints the WAL into this handle's own database file and
    /// truncates it. SQLite does both through the descriptors it opened, so
    /// only this handle's own files are written, wherever they are now.
    /// Without it, SQLite would pair the `-wal` still at `<path>-wal` with
    /// whatever file is put at the path, and write leasehold's pages into
    /// it — another leasehold database (a backup moved there) too, whose
    /// pages lie elsewhere. Nobody else writes that `-wal` meanwhile: a
    /// process opening the new file refuses it while this handle uses the
    /// `-shm` (see `names`).
    pub(super) fn empty_wal(&self, conn: &Connection) {
        if self.read_only || self.wal_emptied.load(Ordering::SeqCst) {
            return;
        }
        match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            r.get::<_, i64>(0)
        }) {
            Ok(0) => {
                self.wal_emptied.store(true, Ordering::SeqCst);
                tracing::info!(path = %self.path.display(),
                    "emptied this process's WAL of the replaced database file, so that it cannot be paired with the file there now");
            }
            Ok(_) => tracing::warn!(path = %self.path.display(),
                "could not empty the WAL of the replaced database file yet (busy)"),
            Err(error) => tracing::warn!(path = %self.path.display(), %error,
                "could not empty the WAL of the replaced database file"),
        }
    }

    /// Fails on a handle opened read-only.
    /// Runs `op` in a `BEGIN IMMEDIATE` transaction of a writer, on a file
    /// still at its path, and commits if it wrote (the second of its
    /// pair), checking the file again first; then tells the other
    /// processes.
    pub(super) fn writing<T>(
        &self,
        op: impl FnOnce(&Connection) -> Result<(T, bool)>,
    ) -> Result<T> {
        self.writable()?;
        let mut conn = self.conn();
        self.usable(&conn)?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err())?;
        let (value, wrote) = op(&tx)?;
        if wrote {
            self.usable(&tx)?;
            tx.commit().map_err(self.err())?;
            self.announce();
        }
        Ok(value)
    }

    pub(super) fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::invalid(
                "store",
                "opened read-only (Access::ReadOnly): it opens no sessions and writes nothing",
            ));
        }
        Ok(())
    }

    pub(super) fn announce(&self) {
        if let Some(notify) = &self.notify {
            notify.announce();
        }
    }

    pub(super) fn check_identity(&self, identity: Identity) -> Result<()> {
        let Identity {
            app_id,
            version,
            objects: tables,
        } = identity;
        let path = self.path.display();
        if app_id == 0 && version == 0 {
            if tables > 0 {
                return Err(Error::Corrupt(format!(
                    "{path} is a SQLite database of another program ({tables} schema objects); \
                     point leasehold at its own file"
                )));
            }
            return Ok(());
        }
        if app_id != APPLICATION_ID {
            return Err(Error::Corrupt(format!(
                "{path} is a SQLite database of another program (application id {app_id:#x})"
            )));
        }
        if version > SCHEMA_VERSION {
            return Err(Error::IncompatibleSchema {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if version < 1 {
            return Err(Error::Corrupt(format!(
                "{path} has leasehold's application id but schema version {version}"
            )));
        }
        Ok(())
    }
}

/// `(application_id, user_version, schema objects)`, read in one statement
/// so that all three come from the same snapshot even while another
/// process is creating the schema.
pub(super) fn read_identity(conn: &Connection) -> rusqlite::Result<Identity> {
    conn.query_row(
        "SELECT (SELECT application_id FROM pragma_application_id()),
                (SELECT user_version FROM pragma_user_version()),
                (SELECT count(*) FROM sqlite_master)",
        [],
        |r| {
            Ok(Identity {
                app_id: r.get(0)?,
                version: r.get(1)?,
                objects: r.get(2)?,
            })
        },
    )
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Identity {
    pub(super) app_id: i64,
    pub(super) version: i64,
    pub(super) objects: i64,
}

/// A reader that would have SQLite create the `-shm` (a `-wal` with
/// content is there, its `-shm` is not) as another user than the
/// database's owner: that `-shm` would lock the owner out (see
/// `check_siblings`), so it is refused, creating nothing.
fn refuse_to_create_the_shm(path: &Path) -> Result<()> {
    let owner = std::fs::metadata(path).map(|m| m.uid()).ok();
    if owner.is_none_or(|uid| uid == nix::unistd::geteuid().as_raw()) {
        return Ok(());
    }
    Err(Error::Denied(format!(
        "reading {shown} now needs {shown}-shm, which is missing; SQLite would create it as this \
         user, and that would lock the database's owner out. Nothing was created: start a replica \
         (`leasehold run`) as the owner, which creates it",
        shown = path.display()
    )))
}

impl Drop for Db {
    /// A handle that did not write leasehold's database (read-only, or it
    /// refused the file) closes without checkpointing and removes the
    /// `-wal` (if empty) and `-shm` its connection created, once no SQLite
    /// connection uses the database: the folder is left as it was.
    fn drop(&mut self) {
        let Ok(placeholder) = Connection::open_in_memory() else {
            return;
        };
        let conn = std::mem::replace(
            self.conn.get_mut().unwrap_or_else(|p| p.into_inner()),
            placeholder,
        );
        if self.verified {
            // The last handle of this name empties its -wal into the file
            // and then removes its record: another name may be used after.
            if !self.read_only
                && !self.replaced.is_cancelled()
                && let Some(claim) = &self.claim
            {
                names::release(&conn, &self.file, claim, &self.path);
            }
            return;
        }
        drop(conn);
        let created: Vec<PathBuf> = [("-wal", self.wal_existed), ("-shm", self.shm_existed)]
            .into_iter()
            .filter(|(_, existed)| !existed)
            .filter_map(|(suffix, _)| {
                let path = sibling(&self.path, suffix);
                let meta = std::fs::symlink_metadata(&path).ok()?;
                (meta.is_file() && (suffix == "-shm" || meta.len() == 0)).then_some(path)
            })
            .collect();
        // Only while this handle's file is still at the path, and no
        // connection (in any process) uses it.
        let still_here = std::fs::metadata(&self.path).is_ok_and(|m| FileId::of(&m) == self.id);
        if created.is_empty() || !still_here || !lock_unused(&self.file, true) {
            return;
        }
        for path in created {
            if let Err(error) = std::fs::remove_file(&path) {
                tracing::debug!(path = %path.display(), %error, "could not remove a file SQLite created");
            }
        }
        lock_unused(&self.file, false);
    }
}
