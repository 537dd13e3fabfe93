-- What is in the schema named $1: whether it exists; the columns of its
-- table schema_version, as `name type[ not null]` joined by ", " (NULL if it
-- has no such table); and how many of leasehold's tables sessions and
-- keys it has. postgres.rs runs it with include_str!, under the
-- schema's advisory lock, before creating or using the schema.
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1),
       (SELECT string_agg(a.attname::text || ' '
                   || format_type(a.atttypid, a.atttypmod)
                   || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
                   ', ' ORDER BY a.attnum)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND c.relname = 'schema_version'
          AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped),
       (SELECT count(*) FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND c.relkind = 'r'
          AND c.relname IN ('sessions', 'keys'));
