"""The stores the lanes live in: the contract every backend keeps (`contract`), the embedded
LevelDB (`leveldb`), PostgreSQL (`postgres`), and the backends by name (`registry`)."""
