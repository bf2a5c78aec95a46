"""The embedded LevelDB database's own mechanics, beneath its lane store
(`store.backends.leveldb`): opening it and telling why it would not open
(`integrity`), what its write-ahead log drops without a word (`log_tail`), and
repairing it with LevelDB's repairer (`repair`)."""
