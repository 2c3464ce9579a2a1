-- Placeholder: migration number 13 belongs to another branch of this round of work
-- (issue 19, h2); it is here only so that store.migrate's "1..N without gaps" check
-- passes on this branch before 0014. Drop this file when the real 0013 is merged.
SELECT 1;
