"""`diode soak`: hours of traffic under a fault schedule, verified record by record."""
