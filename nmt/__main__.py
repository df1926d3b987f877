from nmt.entry import main

main()
