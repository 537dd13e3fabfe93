-- leasehold's PostgreSQL objects for planned moves (see line.rs): notes that
-- sessions keep on elections, and each election's last released token.
-- postgres.rs runs it, with the placeholders of schema.sql filled, in the
-- transaction that creates the schema, and once in a schema an earlier
-- version created (which has none of it). Every statement may run again.
CREATE TABLE IF NOT EXISTS {schema}.notes (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    election text NOT NULL,
    session bigint NOT NULL,
    name text NOT NULL,
    text text NOT NULL,
    UNIQUE (election, session, name));
CREATE TABLE IF NOT EXISTS {schema}.releases (
    election text PRIMARY KEY,
    token bigint NOT NULL);

-- Puts a note of a live session (false if the session has ended), drops the
-- election's notes of ended sessions, and tells the listeners.
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

-- The guarded release of schema.sql, which now also records the token.
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
