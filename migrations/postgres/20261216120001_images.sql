-- Several images per runner. A pool's images as JSON
-- [{ref, expected_image_ids, previous_image_ids, previous_valid_until_ms, drift_grace_s,
-- absent_ok}] (NULL: it describes none) and what it does with a ref it does not describe;
-- a runner's latest attested images as JSON [{ref, id?, digest?, labels?, absent?}].
ALTER TABLE pools ADD COLUMN images TEXT;
ALTER TABLE pools ADD COLUMN undescribed_images TEXT NOT NULL DEFAULT 'refuse';
ALTER TABLE runners ADD COLUMN images TEXT;
