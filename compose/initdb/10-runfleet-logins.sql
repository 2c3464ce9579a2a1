-- Login roles for the compose fleet; the postgres image runs this once, as the
-- superuser, when the data volume is first initialised. Nothing else in the fleet
-- connects as a superuser. The group roles (runfleet_worker, ...) and their privileges
-- come from `runfleet migrate` and `runfleet roles --apply` (the `migrate` service).
-- Demo passwords: in production, take them from a secret store and rotate them with
-- ALTER ROLE ... PASSWORD (docs/how-to/roles.md).
CREATE ROLE runfleet_migrator LOGIN CREATEROLE PASSWORD 'migrator';
CREATE DATABASE runfleet OWNER runfleet_migrator;
REVOKE ALL ON DATABASE runfleet FROM PUBLIC;
CREATE ROLE fleet_worker LOGIN PASSWORD 'worker';
CREATE ROLE demo_producer LOGIN PASSWORD 'producer';
CREATE ROLE fleet_operator LOGIN PASSWORD 'operator';
GRANT CONNECT ON DATABASE runfleet TO fleet_worker, demo_producer, fleet_operator;
