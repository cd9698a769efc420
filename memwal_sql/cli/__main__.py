from memwal_sql.cli import main

main()
