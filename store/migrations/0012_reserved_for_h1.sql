-- Placeholder: migration number 12 belongs to another branch of this round of work
-- (issue 19, h1); it is here only so that store.migrate's "1..N without gaps" check
-- passes on this branch. Drop this file when the real 0012 is merged.
SELECT 1;
