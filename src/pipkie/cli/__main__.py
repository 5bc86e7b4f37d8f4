from pipkie.cli import main

main()
