-- leasehold's PostgreSQL schema: its tables, its functions and its
-- version marker. postgres.rs loads it with include_str! and runs it in one
-- transaction (schema.rs) after `fill_schema_placeholders` has replaced
-- "schema" in braces by the schema's name (checked to be [a-z0-9_], and
-- quoted where it names the schema) and "version" in braces by
-- SCHEMA_VERSION. Each function says what it does above it.
CREATE SCHEMA {schema};
CREATE TABLE {schema}.schema_version (version bigint NOT NULL);
CREATE TABLE {schema}.sessions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ttl_ms bigint NOT NULL CHECK (ttl_ms > 0),
    expires_at timestamptz NOT NULL);
-- The store primitive (postgres/primitive.rs): sessions (above), and keys,
-- each perhaps attached to a session, with the store-wide revision of the
-- commit that created and that last wrote it. `revision` holds the last
-- revision given; every commit locks its one row first, so commits are
-- taken one at a time and each sees every earlier one. A key of an ended session is dead: reads
-- and checks skip it, and the commit that next writes it replaces it.
CREATE TABLE {schema}.revision (value bigint NOT NULL, forgotten bigint NOT NULL);
INSERT INTO {schema}.revision (value, forgotten) VALUES (0, 0);
CREATE TABLE {schema}.keys (
    key text COLLATE "C" PRIMARY KEY,
    value text NOT NULL,
    session bigint,
    created bigint NOT NULL,
    modified bigint NOT NULL);
CREATE INDEX ON {schema}.keys (session);
CREATE INDEX ON {schema}.keys (modified);
-- The revision at which each key was last deleted (by a commit or its
-- session's end), so that a watch that starts late reads whether its
-- prefix changed after a revision: its keys' `modified`, and these.
-- Deletions older than 100,000 revisions are forgotten (housekeeping),
-- and `revision.forgotten` says up to where.
CREATE TABLE {schema}.deletions (
    key text COLLATE "C" PRIMARY KEY,
    revision bigint NOT NULL);

-- Refuses a write to the keys that does not come from the functions below
-- (commit_keys, end_session, forget_old_sessions, which say so for their
-- transaction): a leader's key deleted by hand would let its successor
-- lead at once while it, told nothing, leads on until its next renewal.
-- A guard against mistakes, not against a role that means to write: that
-- one can say so too.
CREATE OR REPLACE FUNCTION {schema}.keys_by_leasehold_alone() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF current_setting('leasehold.writing', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'the table %.keys is written by leasehold alone: a key changed by hand could let two replicas lead at once; stop the leader, or move leadership with leasehold transfer',
            '{schema}' USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER keys_by_leasehold_alone
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {schema}.keys
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.keys_by_leasehold_alone();

CREATE OR REPLACE FUNCTION {schema}.live(p_session bigint) RETURNS boolean
LANGUAGE sql AS $fn$
    SELECT p_session IS NULL OR EXISTS (
        SELECT 1 FROM {schema}.sessions h
        WHERE h.id = p_session AND h.expires_at > clock_timestamp())
$fn$;

-- Refuses a revision counter that is no count of the store's commits: below
-- 0, or below the revision a key was last written at (set by hand, or a
-- damaged store; a key created below its elders would lead beside them).
-- Everything is rolled back; primitive.rs reports it.
CREATE OR REPLACE FUNCTION {schema}.check_counter(p_last bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_written bigint;
BEGIN
    IF p_last < 0 THEN
        RAISE EXCEPTION 'the revision counter %.revision holds %, which is no count of grants',
            '{schema}', p_last USING ERRCODE = 'data_corrupted';
    END IF;
    SELECT max(k.modified) INTO v_written FROM {schema}.keys k;
    IF p_last < v_written THEN
        RAISE EXCEPTION 'the revision counter %.revision holds %, below revision % that a key was written at: it is no count of grants',
            '{schema}', p_last, v_written USING ERRCODE = 'data_corrupted';
    END IF;
END
$fn$;

-- Tells the watches of `p_keys` that they changed at `p_revision`: one
-- key a line. A payload too long for NOTIFY, or a key with a line break
-- in it, names no key: every watch reads again.
CREATE OR REPLACE FUNCTION {schema}.notify_keys(p_revision bigint, p_keys text[])
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    v_payload text := 'k ' || p_revision;
    v_keys text := array_to_string(p_keys, chr(10));
BEGIN
    IF length(v_keys) < 7000
       AND NOT EXISTS (SELECT 1 FROM unnest(p_keys) k WHERE strpos(k, chr(10)) > 0) THEN
        v_payload := v_payload || chr(10) || v_keys;
    END IF;
    PERFORM pg_notify('leasehold_{schema}', v_payload);
END
$fn$;

-- One commit: the checks (kind 'absent', 'created' or 'under', with the
-- key or prefix, for 'under' the least string above the prefix's (NULL:
-- none), and for 'created' the revision and session), then the
-- writes (a put of value and session, or a delete). Returns the new
-- revision; the last one if nothing changed; NULL if a check failed; or,
-- writing nothing, the ended session a put named in `o_expired`.
CREATE OR REPLACE FUNCTION {schema}.commit_keys(
    p_check_kind text[], p_check_key text[], p_check_end text[], p_check_revision bigint[],
    p_check_session bigint[], p_delete boolean[], p_key text[], p_value text[],
    p_session bigint[], OUT o_revision bigint, OUT o_expired bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_last bigint;
    v_next bigint;
    v_found {schema}.keys%ROWTYPE;
    v_changed text[] := '{}';
    v_was_live boolean;
BEGIN
    PERFORM set_config('leasehold.writing', 'on', true);
    SELECT r.value INTO v_last FROM {schema}.revision r FOR UPDATE;
    PERFORM {schema}.check_counter(v_last);
    FOR i IN 1 .. coalesce(cardinality(p_check_kind), 0) LOOP
        -- Two statements, so that the index takes both bounds where there
        -- are two (`end IS NULL OR key < end` it cannot take).
        IF p_check_kind[i] = 'under' AND p_check_end[i] IS NULL THEN
            PERFORM 1 FROM {schema}.keys k
                WHERE k.key >= p_check_key[i] AND {schema}.live(k.session)
                LIMIT 1;
            IF FOUND THEN RETURN; END IF;
        ELSIF p_check_kind[i] = 'under' THEN
            PERFORM 1 FROM {schema}.keys k
                WHERE k.key >= p_check_key[i] AND k.key < p_check_end[i]
                  AND {schema}.live(k.session)
                LIMIT 1;
            IF FOUND THEN RETURN; END IF;
        ELSE
            SELECT * INTO v_found FROM {schema}.keys k
                WHERE k.key = p_check_key[i] AND {schema}.live(k.session);
            IF p_check_kind[i] = 'absent' THEN
                IF FOUND THEN RETURN; END IF;
            ELSIF NOT FOUND OR v_found.created <> p_check_revision[i]
                  OR v_found.session IS DISTINCT FROM p_check_session[i] THEN
                RETURN;
            END IF;
        END IF;
    END LOOP;
    FOR i IN 1 .. coalesce(cardinality(p_key), 0) LOOP
        IF NOT p_delete[i] AND NOT {schema}.live(p_session[i]) THEN
            o_expired := p_session[i];
            RETURN;
        END IF;
    END LOOP;
    -- At the largest bigint, `+ 1` fails with numeric_value_out_of_range
    -- and rolls everything back: primitive.rs reports revisions exhausted.
    v_next := v_last + 1;
    FOR i IN 1 .. coalesce(cardinality(p_key), 0) LOOP
        IF p_delete[i] THEN
            DELETE FROM {schema}.keys k WHERE k.key = p_key[i]
                RETURNING {schema}.live(k.session) INTO v_was_live;
            IF FOUND AND v_was_live THEN
                v_changed := v_changed || p_key[i];
                INSERT INTO {schema}.deletions AS d (key, revision) VALUES (p_key[i], v_next)
                    ON CONFLICT (key) DO UPDATE SET revision = excluded.revision;
            END IF;
        ELSE
            INSERT INTO {schema}.keys AS k (key, value, session, created, modified)
                VALUES (p_key[i], p_value[i], p_session[i], v_next, v_next)
                ON CONFLICT (key) DO UPDATE SET
                    value = excluded.value, session = excluded.session, modified = v_next,
                    created = CASE WHEN {schema}.live(k.session) THEN k.created ELSE v_next END;
            v_changed := v_changed || p_key[i];
        END IF;
    END LOOP;
    IF cardinality(v_changed) = 0 THEN
        o_revision := v_last;
        RETURN;
    END IF;
    UPDATE {schema}.revision SET value = v_next;
    PERFORM {schema}.notify_keys(v_next, v_changed);
    o_revision := v_next;
END
$fn$;

-- Ends a session and its keys at once (one revision, told).
CREATE OR REPLACE FUNCTION {schema}.end_session(p_session bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_next bigint;
    v_ended text[];
BEGIN
    PERFORM set_config('leasehold.writing', 'on', true);
    SELECT r.value + 1 INTO v_next FROM {schema}.revision r FOR UPDATE;
    PERFORM {schema}.check_counter(v_next - 1);
    WITH ended AS (
        DELETE FROM {schema}.keys k
        WHERE k.session = p_session AND {schema}.live(k.session) RETURNING k.key)
    SELECT array_agg(e.key) INTO v_ended FROM ended e;
    DELETE FROM {schema}.keys k WHERE k.session = p_session;
    DELETE FROM {schema}.sessions h WHERE h.id = p_session;
    INSERT INTO {schema}.deletions AS d (key, revision)
        SELECT e, v_next FROM unnest(coalesce(v_ended, '{}')) e
        ON CONFLICT (key) DO UPDATE SET revision = excluded.revision;
    IF v_ended IS NOT NULL THEN
        UPDATE {schema}.revision SET value = v_next;
        PERFORM {schema}.notify_keys(v_next, v_ended);
    END IF;
END
$fn$;

-- Forgets sessions that expired over an hour ago and their dead keys,
-- and deletions older than 100,000 revisions.
CREATE OR REPLACE FUNCTION {schema}.forget_old_sessions() RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_before bigint;
    v_forgot bigint;
BEGIN
    PERFORM set_config('leasehold.writing', 'on', true);
    WITH old AS (
        DELETE FROM {schema}.sessions h
        WHERE h.expires_at < clock_timestamp() - interval '1 hour' RETURNING h.id)
    DELETE FROM {schema}.keys k USING old WHERE k.session = old.id;
    SELECT r.value - 100000 INTO v_before FROM {schema}.revision r;
    WITH forgot AS (
        DELETE FROM {schema}.deletions d WHERE d.revision < v_before RETURNING d.revision)
    SELECT max(f.revision) INTO v_forgot FROM forgot f;
    IF v_forgot IS NOT NULL THEN
        UPDATE {schema}.revision r SET forgotten = greatest(r.forgotten, v_forgot);
    END IF;
END
$fn$;

INSERT INTO {schema}.schema_version (version) VALUES ({version});
