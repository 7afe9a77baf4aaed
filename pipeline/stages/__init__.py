"""The first pass and the stages that judge records: every decision is taken here, on light rows."""
