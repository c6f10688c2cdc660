"""What the tests share: helpers, the tasks they plan, specs, old ledgers, the torch counter."""
