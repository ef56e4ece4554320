-- 0006_bytewise_collation: every text column compares byte by byte.
--
-- The registry orders identifiers by their bytes (registry.Catalog pages by
-- capability ID in byte order; the catalog's cached views are searched in
-- Go, which compares bytes). The tables were created with the database's
-- default collation, and a database created with a linguistic one (en_US,
-- an ICU locale: the default of many installations and container images)
-- sorts "cap.B" after "cap.a" and "cap.x_1" before "cap.x1". The cached
-- views then came back in an order Go's binary search does not expect:
-- catalog paging never ended and a visible capability looked up by ID
-- could be reported missing. With the "C" collation the database orders as Go does,
-- whatever the database's default, and the indexes no longer depend on
-- the operating system's collation library (whose upgrades can silently
-- reorder text and corrupt indexes).
--
-- Every text column of the schema changes; PostgreSQL rebuilds the indexes
-- and foreign keys that use them (not the tables' rows) while it holds the
-- tables' locks, so run it when the registry is quiet.

DO $$
DECLARE
    col record;
BEGIN
    FOR col IN
        SELECT c.table_name, c.column_name
        FROM information_schema.columns c
        JOIN information_schema.tables t USING (table_schema, table_name)
        WHERE c.table_schema = 'aip_registry' AND t.table_type = 'BASE TABLE'
          AND c.data_type = 'text'
          AND c.collation_name IS DISTINCT FROM 'C'
        ORDER BY c.table_name, c.ordinal_position
    LOOP
        EXECUTE format('ALTER TABLE aip_registry.%I ALTER COLUMN %I TYPE text COLLATE "C"', col.table_name, col.column_name);
    END LOOP;
END
$$;
