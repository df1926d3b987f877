from nmt.cli.entry import main

main()
