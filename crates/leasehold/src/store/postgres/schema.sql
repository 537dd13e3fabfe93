-- leasehold's PostgreSQL schema: its tables, its functions and its
-- version marker. postgres.rs loads it with include_str! and runs it in one
-- transaction after `fill_schema_placeholders` has replaced "schema" in
-- braces by the schema's name (checked to be [a-z0-9_]) and "version" in
-- braces by SCHEMA_VERSION. What each function does is described in
-- postgres.rs at `SCHEMA_SQL`.
CREATE SCHEMA {schema};
CREATE TABLE {schema}.schema_version (version bigint NOT NULL);
CREATE TABLE {schema}.sessions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ttl_ms bigint NOT NULL CHECK (ttl_ms > 0),
    expires_at timestamptz NOT NULL);
CREATE TABLE {schema}.elections (
    name text PRIMARY KEY,
    token bigint NOT NULL,
    session bigint,
    candidate text);
CREATE TABLE {schema}.waiters (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    election text NOT NULL,
    session bigint NOT NULL,
    UNIQUE (election, session));
CREATE TABLE {schema}.notes (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    election text NOT NULL,
    session bigint NOT NULL,
    name text NOT NULL,
    text text NOT NULL,
    UNIQUE (election, session, name));
CREATE TABLE {schema}.releases (
    election text PRIMARY KEY,
    token bigint NOT NULL);
CREATE OR REPLACE FUNCTION {schema}.queue_head(
    p_name text, OUT o_session bigint, OUT o_left_ms bigint)
LANGUAGE sql AS $fn$
    SELECT w.session,
           (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::bigint
    FROM {schema}.waiters w
    JOIN {schema}.sessions h ON h.id = w.session AND h.expires_at > clock_timestamp()
    WHERE w.election = p_name
    ORDER BY w.seq
    LIMIT 1
$fn$;

CREATE OR REPLACE FUNCTION {schema}.notify_release(p_name text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('leasehold_{schema}',
        p_name || ' ' || coalesce((SELECT q.o_session FROM {schema}.queue_head(p_name) q)::text, ''));
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.acquire(
    p_session bigint, p_name text, p_candidate text,
    OUT o_granted boolean, OUT o_token bigint, OUT o_wait_ms bigint,
    OUT o_fresh boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_token bigint;
    v_holder bigint;
    v_left bigint;
    v_head bigint;
    v_head_left bigint;
BEGIN
    INSERT INTO {schema}.elections AS e (name, token) VALUES (p_name, 0)
        ON CONFLICT (name) DO NOTHING;
    SELECT e.token, e.session INTO v_token, v_holder
        FROM {schema}.elections e WHERE e.name = p_name FOR UPDATE;
    -- A counter below 0 (set by hand, or a damaged store) is no count of
    -- grants: refused, everything rolled back; postgres.rs reports it.
    IF v_token < 0 THEN
        RAISE EXCEPTION 'the fencing token counter of election % holds %, which is no count of grants',
            p_name, v_token USING ERRCODE = 'data_corrupted';
    END IF;
    PERFORM 1 FROM {schema}.sessions h
        WHERE h.id = p_session AND h.expires_at > clock_timestamp() FOR SHARE;
    IF NOT FOUND THEN
        DELETE FROM {schema}.waiters w WHERE w.election = p_name AND w.session = p_session;
        RETURN;
    END IF;
    o_token := v_token;
    IF v_holder IS NOT NULL THEN
        SELECT (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::bigint
            INTO v_left
            FROM {schema}.sessions h
            WHERE h.id = v_holder AND h.expires_at > clock_timestamp() FOR UPDATE;
        IF FOUND THEN
            IF v_holder = p_session THEN
                -- Held already: not this call's grant (o_fresh stays null),
                -- so a dropped campaign's cleanup does not release it.
                o_granted := true;
                o_wait_ms := 0;
                RETURN;
            END IF;
            INSERT INTO {schema}.waiters (election, session) VALUES (p_name, p_session)
                ON CONFLICT DO NOTHING;
            SELECT q.o_session, q.o_left_ms INTO v_head, v_head_left
                FROM {schema}.queue_head(p_name) q;
            o_granted := false;
            -- The first in line wakes at the holder's expiry; the
            -- others only if the first's session expires first.
            o_wait_ms := CASE WHEN v_head = p_session THEN v_left
                              ELSE v_head_left END;
            RETURN;
        END IF;
    END IF;
    INSERT INTO {schema}.waiters (election, session) VALUES (p_name, p_session)
        ON CONFLICT DO NOTHING;
    SELECT q.o_session, q.o_left_ms INTO v_head, v_head_left
        FROM {schema}.queue_head(p_name) q;
    IF v_head IS DISTINCT FROM p_session THEN
        o_granted := false;
        o_wait_ms := v_head_left;
        RETURN;
    END IF;
    -- At the largest bigint, `+ 1` fails with numeric_value_out_of_range
    -- and rolls everything back: postgres.rs reports the counter exhausted.
    UPDATE {schema}.elections e SET token = e.token + 1, session = p_session, candidate = p_candidate
        WHERE e.name = p_name RETURNING e.token INTO v_token;
    DELETE FROM {schema}.waiters w
        WHERE w.election = p_name
          AND (w.session = p_session OR NOT EXISTS (
               SELECT 1 FROM {schema}.sessions h
               WHERE h.id = w.session AND h.expires_at > clock_timestamp()));
    PERFORM pg_notify('leasehold_{schema}', p_name);
    o_granted := true;
    o_token := v_token;
    o_wait_ms := 0;
    o_fresh := true;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.release(p_name text, p_token bigint, p_session bigint)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE {schema}.elections e SET session = NULL, candidate = NULL
        WHERE e.name = p_name AND e.token = p_token AND e.session = p_session;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO {schema}.releases (election, token) VALUES (p_name, p_token)
        ON CONFLICT (election) DO UPDATE SET token = excluded.token;
    PERFORM {schema}.notify_release(p_name);
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.withdraw(p_name text, p_session bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {schema}.waiters w WHERE w.election = p_name AND w.session = p_session;
    IF FOUND THEN
        -- It may have been woken for a release it will not take.
        PERFORM {schema}.notify_release(p_name);
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.close_session(p_session bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_names text[];
BEGIN
    WITH released AS (
        UPDATE {schema}.elections e SET session = NULL, candidate = NULL
        WHERE e.session = p_session RETURNING e.name),
    unqueued AS (
        DELETE FROM {schema}.waiters w WHERE w.session = p_session RETURNING w.election)
    SELECT array_agg(DISTINCT n) INTO v_names
        FROM (SELECT name AS n FROM released UNION SELECT election FROM unqueued) x;
    DELETE FROM {schema}.sessions h WHERE h.id = p_session;
    PERFORM {schema}.notify_release(n) FROM unnest(coalesce(v_names, '{}')) n;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.put_note(
    p_name text, p_session bigint, p_note text, p_text text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM 1 FROM {schema}.sessions h
        WHERE h.id = p_session AND h.expires_at > clock_timestamp() FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM {schema}.notes n
        WHERE n.election = p_name AND NOT EXISTS (
            SELECT 1 FROM {schema}.sessions h
            WHERE h.id = n.session AND h.expires_at > clock_timestamp());
    INSERT INTO {schema}.notes (election, session, name, text)
        VALUES (p_name, p_session, p_note, p_text)
        ON CONFLICT (election, session, name) DO UPDATE SET text = excluded.text;
    PERFORM pg_notify('leasehold_{schema}', '#n ' || p_name);
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.delete_note(
    p_name text, p_session bigint, p_note text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {schema}.notes n
        WHERE n.election = p_name AND n.session = p_session AND n.name = p_note;
    IF FOUND THEN
        PERFORM pg_notify('leasehold_{schema}', '#n ' || p_name);
    END IF;
END
$fn$;

-- The store primitive (postgres/primitive.rs): keys, each perhaps attached
-- to a session, with the store-wide revision of the commit that created
-- and that last wrote it. `revision` holds the last revision given; every
-- commit locks its one row first, so commits are taken one at a time and
-- each sees every earlier one. A key of an ended session is dead: reads
-- and checks skip it, and the commit that next writes it replaces it.
CREATE TABLE {schema}.revision (value bigint NOT NULL);
INSERT INTO {schema}.revision (value) VALUES (0);
CREATE TABLE {schema}.keys (
    key text COLLATE "C" PRIMARY KEY,
    value text NOT NULL,
    session bigint,
    created bigint NOT NULL,
    modified bigint NOT NULL);
CREATE INDEX ON {schema}.keys (session);

CREATE OR REPLACE FUNCTION {schema}.live(p_session bigint) RETURNS boolean
LANGUAGE sql AS $fn$
    SELECT p_session IS NULL OR EXISTS (
        SELECT 1 FROM {schema}.sessions h
        WHERE h.id = p_session AND h.expires_at > clock_timestamp())
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
-- key or prefix, and for 'created' the revision and session), then the
-- writes (a put of value and session, or a delete). Returns the new
-- revision; the last one if nothing changed; NULL if a check failed; or,
-- writing nothing, the ended session a put named in `o_expired`.
CREATE OR REPLACE FUNCTION {schema}.commit_keys(
    p_check_kind text[], p_check_key text[], p_check_revision bigint[],
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
    SELECT r.value INTO v_last FROM {schema}.revision r FOR UPDATE;
    FOR i IN 1 .. coalesce(cardinality(p_check_kind), 0) LOOP
        IF p_check_kind[i] = 'under' THEN
            PERFORM 1 FROM {schema}.keys k
                WHERE k.key >= p_check_key[i] AND starts_with(k.key, p_check_key[i])
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

-- Ends a session: its keys at once (one revision, told), then its grants
-- and places in line (close_session).
CREATE OR REPLACE FUNCTION {schema}.end_session(p_session bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_next bigint;
    v_ended text[];
BEGIN
    SELECT r.value + 1 INTO v_next FROM {schema}.revision r FOR UPDATE;
    WITH ended AS (
        DELETE FROM {schema}.keys k
        WHERE k.session = p_session AND {schema}.live(k.session) RETURNING k.key)
    SELECT array_agg(e.key) INTO v_ended FROM ended e;
    DELETE FROM {schema}.keys k WHERE k.session = p_session;
    IF v_ended IS NOT NULL THEN
        UPDATE {schema}.revision SET value = v_next;
        PERFORM {schema}.notify_keys(v_next, v_ended);
    END IF;
    PERFORM {schema}.close_session(p_session);
END
$fn$;

INSERT INTO {schema}.schema_version (version) VALUES ({version});
