from alma.cli.main import main

main()
