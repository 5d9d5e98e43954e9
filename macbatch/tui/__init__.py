"""`macbatch chat`: a Textual app where every chat session generates at once on one engine."""
