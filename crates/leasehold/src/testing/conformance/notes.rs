//! Notes: ordered, amended in place, watched, ended with their session;
//! and the records of releases.

use super::*;

/// The names and texts of `notes`.
fn names_of(notes: Vec<crate::store::Note>) -> Vec<(String, String)> {
    notes.into_iter().map(|n| (n.name, n.text)).collect()
}

/// The note of `short`'s session goes when it expires unrenewed, and no
/// note can be put on it then; a deleted note goes alone (twice is fine).
async fn the_expired_and_deleted_notes_go(
    a: &dyn Store,
    b: &dyn Store,
    (sa, sb, short): (
        &crate::store::SessionLease,
        &crate::store::SessionLease,
        &crate::store::SessionLease,
    ),
    election: &ElectionName,
) {
    // The short session expires unrenewed: its note goes with it.
    tokio::time::sleep(short.ttl + Duration::from_millis(500)).await;
    a.keep_alive(sa.id).await.expect("renew");
    b.keep_alive(sb.id).await.expect("renew");
    let names = names_of(a.notes(election).await.expect("notes"));
    assert!(
        !names.contains(&("cand".into(), "1 short".into())),
        "an expired session's note must be gone: {names:?}"
    );
    match b.put_note(short.id, election, "cand", "late").await {
        Err(Error::SessionExpired(id)) => assert_eq!(id, short.id),
        other => panic!("a note on an ended session must fail with SessionExpired, got {other:?}"),
    }
    // Deleting one note leaves the session's others; deleting twice is fine.
    a.delete_note(sa.id, election, "next")
        .await
        .expect("delete");
    a.delete_note(sa.id, election, "next")
        .await
        .expect("delete again");
    assert_eq!(
        names_of(b.notes(election).await.expect("notes")),
        [
            ("cand".into(), "3 a again".into()),
            ("cand".into(), "5 b".into())
        ]
    );
}

/// Notes (the line of standbys, transfer requests): kept in the order
/// first put, replaced in place, one per session and name, gone with
/// their session (closed or expired), refused on an ended session or with
/// a bad name or text, and never visible on another election.
pub async fn notes_are_ordered_and_end_with_their_session(harness: &dyn StoreHarness) {
    let election = unique_election("notes");
    let other = unique_election("notes-other");
    let a = harness.open().await;
    let b = harness.open().await;
    let sa = a.open_session(LONG_TTL).await.expect("open");
    let sb = b.open_session(LONG_TTL).await.expect("open");
    let short = b.open_session(SHORT_TTL).await.expect("open");
    for (store, session, on, name, text) in [
        (&a, sa.id, &election, "cand", "0 a"),
        (&b, sb.id, &election, "cand", "5 b"),
        (&b, short.id, &election, "cand", "1 short"),
        (&a, sa.id, &election, "next", "b"),
        (&b, sb.id, &other, "cand", "elsewhere"),
    ] {
        store.put_note(session, on, name, text).await.expect("put");
    }
    // Replacing keeps the note's place.
    a.put_note(sa.id, &election, "cand", "3 a again")
        .await
        .expect("replace");
    let notes = within("read notes", b.notes(&election))
        .await
        .expect("notes");
    assert!(
        notes.windows(2).all(|w| w[0].order < w[1].order),
        "notes must come in increasing order: {notes:?}"
    );
    assert_eq!(
        names_of(notes.clone()),
        [
            ("cand".into(), "3 a again".into()),
            ("cand".into(), "5 b".into()),
            ("cand".into(), "1 short".into()),
            ("next".into(), "b".into()),
        ],
        "notes in the order first put, replaced in place: {notes:?}"
    );
    assert_eq!(notes[0].session, sa.id);
    assert_eq!(notes[1].session, sb.id);
    the_expired_and_deleted_notes_go(&*a, &*b, (&sa, &sb, &short), &election).await;
    // Closing a session removes its notes.
    a.close_session(sa.id).await.expect("close");
    assert_eq!(
        names_of(b.notes(&election).await.expect("notes")),
        [("cand".into(), "5 b".into())]
    );
    assert_eq!(
        names_of(b.notes(&other).await.expect("notes")),
        [("cand".into(), "elsewhere".into())]
    );
    bad_notes_are_refused(&*b, sb.id, &election).await;
}

/// Notes with a name or text [`crate::store::check_note`] refuses are
/// [`Error::InvalidInput`]; an election nobody noted has no notes.
async fn bad_notes_are_refused(b: &dyn Store, sb: SessionId, election: &ElectionName) {
    for (name, text) in [
        ("", "x"),
        ("Cand", "x"),
        ("a/b", "x"),
        ("cand", "line\nbreak"),
    ] {
        match b.put_note(sb, election, name, text).await {
            Err(Error::InvalidInput { .. }) => {}
            other => panic!("note {name:?} {text:?} must be refused as invalid, got {other:?}"),
        }
    }
    let long = "x".repeat(crate::store::MAX_NOTE_TEXT + 1);
    assert!(matches!(
        b.put_note(sb, election, "cand", &long).await,
        Err(Error::InvalidInput { .. })
    ));
    assert!(
        b.notes(&unique_election("no-notes"))
            .await
            .expect("notes of an election nobody noted")
            .is_empty()
    );
}

/// A notes watch publishes every put and delete, and a note whose session
/// expires without anyone writing.
pub async fn notes_watch_sees_puts_deletes_and_expiries(harness: &dyn StoreHarness) {
    let election = unique_election("notes-watch");
    let store = harness.open().await;
    let watcher = harness.open().await;
    let mut notes = watcher.watch_notes(&election).await.expect("watch");
    assert!(notes.borrow_and_update().is_empty());
    let long = store.open_session(LONG_TTL).await.expect("open");
    let short = store.open_session(SHORT_TTL).await.expect("open");
    store
        .put_note(long.id, &election, "cand", "0 long")
        .await
        .expect("put");
    store
        .put_note(short.id, &election, "cand", "0 short")
        .await
        .expect("put");
    let texts = |notes: &crate::watch::Receiver<Vec<crate::store::Note>>| -> Vec<String> {
        notes.borrow().iter().map(|n| n.text.clone()).collect()
    };
    within(
        "the watch to see both notes",
        notes.wait_for(|n| n.len() == 2),
    )
    .await
    .expect("watch alive");
    assert_eq!(texts(&notes), ["0 long", "0 short"]);
    within(
        "the watch to see the short session's note expire",
        notes.wait_for(|n| n.len() == 1),
    )
    .await
    .expect("watch alive");
    assert_eq!(texts(&notes), ["0 long"]);
    store
        .delete_note(long.id, &election, "cand")
        .await
        .expect("delete");
    within(
        "the watch to see the delete",
        notes.wait_for(|n| n.is_empty()),
    )
    .await
    .expect("watch alive");
}

/// An amendment of a note never put says so and makes none.
async fn no_amend_makes_a_note(other: &dyn Store, session: SessionId, election: &ElectionName) {
    assert!(
        !other
            .amend_note(session, election, "cand", "0 x 1")
            .await
            .expect("amend a note never put"),
        "amending a note that is not there must say so"
    );
    assert!(other.notes(election).await.expect("notes").is_empty());
}

/// An amendment with a name or text that [`crate::store::check_note`]
/// refuses is [`Error::InvalidInput`].
async fn invalid_amends_are_refused(other: &dyn Store, long: SessionId, election: &ElectionName) {
    for (name, text) in [
        (
            "cand",
            "line
break",
        ),
        ("Cand", "x"),
    ] {
        assert!(
            matches!(
                other.amend_note(long, election, name, text).await,
                Err(Error::InvalidInput { .. })
            ),
            "amending with {name:?} {text:?} must be refused as invalid"
        );
    }
}

/// The texts of the notes `watch` holds.
fn texts_of(watch: &crate::watch::Receiver<Vec<crate::store::Note>>) -> Vec<String> {
    watch.borrow().iter().map(|n| n.text.clone()).collect()
}

/// `amend_note` replaces another session's note in place (same session,
/// same order) from any handle, and never makes a note that is not there
/// (never put, deleted, or of an ended session). A one-note watch holds
/// that note alone, and follows its put, amendment, delete and expiry.
pub async fn a_note_is_amended_in_place_and_watched_alone(harness: &dyn StoreHarness) {
    let election = unique_election("amend");
    let owner = harness.open().await;
    let other = harness.open().await;
    let long = owner.open_session(LONG_TTL).await.expect("open");
    let short = owner.open_session(SHORT_TTL).await.expect("open");
    let mut watched = other
        .watch_note(long.id, &election, "cand")
        .await
        .expect("watch one note");
    assert!(watched.borrow_and_update().is_empty());
    no_amend_makes_a_note(&*other, long.id, &election).await;
    for (session, text) in [(short.id, "0 first"), (long.id, "0 second")] {
        owner
            .put_note(session, &election, "cand", text)
            .await
            .expect("put");
    }
    within(
        "the one-note watch to see its note",
        watched.wait_for(|n| !n.is_empty()),
    )
    .await
    .expect("watch alive");
    assert_eq!(texts_of(&watched), ["0 second"]);
    assert!(
        other
            .amend_note(long.id, &election, "cand", "0 second 7")
            .await
            .expect("amend"),
        "amending a live note from another handle must succeed"
    );
    let notes = other.notes(&election).await.expect("notes");
    let shown: Vec<(SessionId, &str)> =
        notes.iter().map(|n| (n.session, n.text.as_str())).collect();
    assert_eq!(
        shown,
        [(short.id, "0 first"), (long.id, "0 second 7")],
        "an amended note keeps its session and its place"
    );
    within(
        "the one-note watch to see the amendment",
        watched.wait_for(|n| n.first().is_some_and(|n| n.text == "0 second 7")),
    )
    .await
    .expect("watch alive");
    assert_eq!(watched.borrow()[0].session, long.id);
    // Only that note: the other session's note never shows in it.
    assert_eq!(texts_of(&watched), ["0 second 7"]);
    amends_end_with_the_note(
        &*owner,
        &*other,
        &election,
        (short.id, long.id),
        &mut watched,
    )
    .await;
}

/// The rest of [`a_note_is_amended_in_place_and_watched_alone`]: an
/// amendment of another shape is refused; a deleted note, or one whose
/// session expired, is not amended back.
async fn amends_end_with_the_note(
    owner: &dyn Store,
    other: &dyn Store,
    election: &ElectionName,
    (short, long): (SessionId, SessionId),
    watched: &mut crate::watch::Receiver<Vec<crate::store::Note>>,
) {
    invalid_amends_are_refused(other, long, election).await;
    owner
        .delete_note(long, election, "cand")
        .await
        .expect("delete");
    within(
        "the one-note watch to see the delete",
        watched.wait_for(|n| n.is_empty()),
    )
    .await
    .expect("watch alive");
    assert!(
        !other
            .amend_note(long, election, "cand", "0 back")
            .await
            .expect("amend a deleted note"),
        "amending a deleted note must not make it again"
    );
    // The short session expires unrenewed: its note goes, and cannot be
    // amended back.
    let mut expiring = other
        .watch_note(short, election, "cand")
        .await
        .expect("watch one note");
    within(
        "the one-note watch to see its session expire",
        expiring.wait_for(|n| n.is_empty()),
    )
    .await
    .expect("watch alive");
    assert!(
        !other
            .amend_note(short, election, "cand", "0 late")
            .await
            .expect("amend an expired session's note"),
        "an ended session's note must not be amended"
    );
    owner.keep_alive(long).await.expect("renew");
    assert!(other.notes(election).await.expect("notes").is_empty());
}

/// A release (resign, or a dead holder's release from another handle) is
/// recorded with its token; an expiry or a closed session is not.
pub async fn releases_are_recorded_and_expiries_are_not(harness: &dyn StoreHarness) {
    let election = unique_election("last-release");
    let store = harness.open().await;
    let other = harness.open().await;
    assert_eq!(store.last_release(&election).await.expect("read"), None);
    let first = grant_on(&store, &election, "a").await;
    store.resign(&first).await.expect("resign");
    assert_eq!(
        other.last_release(&election).await.expect("read"),
        Some(first.token)
    );
    let lease = store.open_session(SHORT_TTL).await.expect("open");
    let second = within(
        "campaign",
        store.campaign(lease.id, &election, &candidate("b")),
    )
    .await
    .expect("campaign");
    // Expiry: the record still names the first grant.
    let third = within(
        "takeover after expiry",
        crate::testing::campaign_on_new_session(&*other, &election, "c", LONG_TTL),
    )
    .await;
    assert!(third.token > second.token);
    assert_eq!(
        store.last_release(&election).await.expect("read"),
        Some(first.token),
        "an expiry must not be recorded as a release"
    );
    other.release_orphaned(&third).await.expect("release");
    assert_eq!(
        store.last_release(&election).await.expect("read"),
        Some(third.token)
    );
    let fourth = grant_on(&other, &election, "d").await;
    other.close_session(fourth.session).await.expect("close");
    assert_eq!(
        store.last_release(&election).await.expect("read"),
        Some(third.token),
        "closing a session must not be recorded as a release"
    );
}
