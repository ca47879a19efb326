-- First-start initialisation of the compose PostgreSQL (run once, by the postgres image's
-- entrypoint, only when the data volume is empty). Two databases, two owners, so Airflow
-- and the offloader metadata store can be backed up, restored and migrated separately and
-- neither role can touch the other's tables.
--
-- Passwords come from the container environment through psql's \getenv (psql >= 15), so
-- nothing secret is written in this file. An unset variable leaves the :'...' reference
-- unsubstituted, the statement fails and ON_ERROR_STOP (set by the image) aborts the init.

\getenv airflow_db_password AIRFLOW_DB_PASSWORD
\getenv offloader_db_password OFFLOADER_DB_PASSWORD

CREATE ROLE airflow LOGIN PASSWORD :'airflow_db_password';
CREATE ROLE offloader LOGIN PASSWORD :'offloader_db_password';

-- Owned by their roles: since PostgreSQL 15 only the database owner may create objects in
-- the public schema, and both Airflow and the offloader run their own migrations.
CREATE DATABASE airflow OWNER airflow;
CREATE DATABASE offloader OWNER offloader;

REVOKE ALL ON DATABASE airflow FROM PUBLIC;
REVOKE ALL ON DATABASE offloader FROM PUBLIC;
